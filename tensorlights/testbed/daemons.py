"""How the testbed's users (the demo, the benchmark, the e2e tests) start the controller and
point agents at it: one place for the command line and the agent's [controller] section."""

from __future__ import annotations

import sys
from pathlib import Path

CONTROLLER = [sys.executable, "-m", "tensorlights.cli.controller"]


def controller_command(
    config: Path, listen: str, socket: Path, state_dir: Path, pki: Path, *flags: str
) -> list[str]:
    """`tensorlights-controller run` with its TLS identity from `pki` (devca.make_pki's
    layout: ca.pem, controller.pem, controller.key)."""
    return [
        *CONTROLLER, "run", "--config", str(config), "--listen", listen,
        "--socket", str(socket), "--state-dir", str(state_dir),
        "--tls-ca", str(pki / "ca.pem"), "--tls-cert", str(pki / "controller.pem"),
        "--tls-key", str(pki / "controller.key"), *flags,
    ]  # fmt: skip


def controller_section(address: str, pki: Path, host: str, ca: Path | None = None) -> str:
    """An agent config's [controller] section: follow the controller at `address` as `host`
    (its certificate in `pki`), trusting `ca` (default: pki's)."""
    return (
        "[controller]\n"
        f'address = "{address}"\n'
        f'ca = "{ca or pki / "ca.pem"}"\n'
        f'cert = "{pki / host}.pem"\n'
        f'key = "{pki / host}.key"\n'
        f'host = "{host}"\n'
    )
