"""Real processes holding real sockets, with launcher-style environments, for discovery tests."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from tensorlights.discovery.rules import DiscoveryRules
from tensorlights.discovery.scanner import Scanner
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
    return Scanner(rules or DiscoveryRules(), **kwargs)


def tf_config(task_type: str, index: int | str, workers: int = 2, tag: str = "a") -> str:
    cluster = {
        "ps": [f"ps-{tag}:2222"],
        "worker": [f"w{i}-{tag}:2222" for i in range(workers)],
    }
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})
