"""Where we remember the root qdisc we replaced, so `cleanup` can put it back.

One small JSON file per (network namespace, interface) under the state directory, written
atomically before we touch the interface.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from tensorlights.errors import PermanentError
from tensorlights.model import PreviousRootQdisc


class RootQdiscRecords:
    def __init__(self, state_dir: Path, netns: str | None = None) -> None:
        self.state_dir = state_dir
        self.scope = (netns or "host").replace("/", "_")

    def _path(self, interface: str) -> Path:
        return self.state_dir / f"root-qdisc.{self.scope}.{interface}.json"

    def load(self, interface: str) -> PreviousRootQdisc | None:
        path = self._path(interface)
        try:
            data = json.loads(path.read_text())
            return PreviousRootQdisc(
                kind=data["kind"],
                handle=int(data["handle"]),
                is_default=bool(data["is_default"]),
                options=bytes.fromhex(data.get("options", "")),
            )
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError) as exc:
            raise PermanentError(f"{path} is corrupt ({exc}); remove it to continue") from exc

    def save(self, interface: str, record: PreviousRootQdisc) -> None:
        try:
            self.state_dir.mkdir(parents=True, exist_ok=True)
            data = {
                "kind": record.kind,
                "handle": record.handle,
                "is_default": record.is_default,
                "options": record.options.hex(),
            }
            fd, tmp = tempfile.mkstemp(dir=self.state_dir, prefix=".root-qdisc.")
            with os.fdopen(fd, "w") as handle:
                json.dump(data, handle)
            os.replace(tmp, self._path(interface))
        except OSError as exc:
            raise PermanentError(
                f"cannot record the previous root qdisc under {self.state_dir}: {exc}"
            ) from exc

    def forget(self, interface: str) -> None:
        path = self._path(interface)
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            raise PermanentError(
                f"cannot remove {path} ({exc.strerror}): the state directory must be writable"
            ) from exc
