"""Real processes holding real sockets, with launcher-style environments, for discovery tests."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tensorlights.discovery.rules import DiscoveryRules
from tensorlights.discovery.scanner import Scanner
from tensorlights.discovery.trust import TRUST_ANY
from tensorlights.model import DiscoverySnapshot
from tensorlights.testbed.socket_holder import Holder, start_holder


@contextmanager
def holders() -> Iterator[Callable[..., Holder]]:
    """Start holders through the yielded function; all are stopped at the end."""
    started: list[Holder] = []

    def start(env: Mapping[str, str], *args: str, **kwargs: Any) -> Holder:
        holder = start_holder(env, *args, **kwargs)
        started.append(holder)
        return holder

    try:
        yield start
    finally:
        for holder in started:
            holder.stop()


def scan_until(
    scanner: Scanner,
    done: Callable[[DiscoverySnapshot], bool],
    deadline_s: float = 10.0,
    every_s: float = 0.05,
) -> DiscoverySnapshot:
    """Scan until `done` holds (polling with a deadline); the last snapshot either way."""
    end = time.monotonic() + deadline_s
    while True:
        snapshot = scanner.scan()
        if done(snapshot) or time.monotonic() > end:
            return snapshot
        time.sleep(every_s)


def new_scanner(rules: DiscoveryRules | None = None, **kwargs: Any) -> Scanner:
    """A scanner that believes the test's own processes unless `rules` say otherwise."""
    return Scanner(rules or DiscoveryRules(trust=TRUST_ANY), **kwargs)


def cgroup_mount() -> Path | None:
    """The cgroup v2 mount, else a v1 freezer (Slurm's own v1 choice), from /proc/mounts."""
    mounts = [line.split() for line in Path("/proc/mounts").read_text().splitlines()]
    for fstype, option in (("cgroup2", None), ("cgroup", "freezer")):
        for _, target, kind, options, *_ in mounts:
            if kind == fstype and (option is None or option in options.split(",")):
                return Path(target)
    return None


@contextmanager
def own_cgroup(relative: str) -> Iterator[Path]:
    """A cgroup subtree of our own shaped like a resource manager's (`relative` under a unique
    directory, e.g. "job_1/step_0") on a real cgroup filesystem, removed afterwards (its
    processes are moved back to the root cgroup first). Skips the test where no cgroup can
    be made."""
    mount = cgroup_mount()
    if mount is None:
        pytest.skip("no cgroup filesystem is mounted")
    base = mount / f"tl-test-{uuid.uuid4().hex[:8]}"
    leaf = base / relative
    try:
        leaf.mkdir(parents=True)
    except OSError as exc:
        pytest.skip(f"cannot create a cgroup under {mount}: {exc}")
    try:
        assert (leaf / "cgroup.procs").exists(), f"{mount} is not a cgroup filesystem"
        yield leaf
    finally:
        for directory in [leaf, *leaf.parents]:
            if directory == mount:
                break
            for pid in (directory / "cgroup.procs").read_text().split():
                with open(mount / "cgroup.procs", "w") as procs:
                    procs.write(pid)
            directory.rmdir()


def in_cgroup(leaf: Path) -> list[str]:
    """A command prefix that moves the process into `leaf` (as root, first) and execs the
    rest."""
    return ["sh", "-c", f'echo $$ > {leaf}/cgroup.procs && exec "$@"', "sh"]


def tf_config(task_type: str, index: int | str, workers: int = 2, tag: str = "a") -> str:
    cluster = {
        "ps": [f"ps-{tag}:2222"],
        "worker": [f"w{i}-{tag}:2222" for i in range(workers)],
    }
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})
