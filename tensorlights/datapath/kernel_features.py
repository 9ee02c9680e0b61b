"""What the running kernel can do, read from the kernel's own configuration (no probing that
could disturb an interface)."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

from tensorlights.errors import UnsupportedKernelError

QDISC_CONFIG = {"prio": "CONFIG_NET_SCH_PRIO", "htb": "CONFIG_NET_SCH_HTB"}


def kernel_config(root: Path = Path("/")) -> dict[str, str] | None:
    """CONFIG_* values from /proc/config.gz or /boot/config-$(uname -r); None if neither."""
    candidates = [root / "proc/config.gz", root / f"boot/config-{os.uname().release}"]
    for path in candidates:
        try:
            raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
        except (OSError, EOFError, gzip.BadGzipFile):
            continue
        values: dict[str, str] = {}
        for line in raw.decode(errors="replace").splitlines():
            if line.startswith("CONFIG_") and "=" in line:
                key, _, value = line.partition("=")
                values[key] = value
        return values
    return None


def qdisc_available(kind: str, root: Path = Path("/")) -> bool | None:
    """True/False when the kernel tells; None when it cannot be known without trying."""
    option = QDISC_CONFIG[kind]
    if (root / f"sys/module/sch_{kind}").exists():
        return True
    config = kernel_config(root)
    if config is None:
        return None
    value = config.get(option)
    if value == "y":
        return True
    if value == "m":
        release = os.uname().release
        return any((root / f"lib/modules/{release}").rglob(f"sch_{kind}.ko*"))
    return False


def require_qdisc(kind: str, root: Path = Path("/")) -> None:
    if qdisc_available(kind, root) is False:
        raise UnsupportedKernelError(
            f"the {kind} backend needs the kernel's {QDISC_CONFIG[kind]} (sch_{kind}), and this "
            f'kernel ({os.uname().release}) was built without it. Use backend = "htb", which '
            "gives the same strict priority plus a guaranteed share for unmanaged traffic."
        )
