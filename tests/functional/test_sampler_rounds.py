"""Which connections the telemetry sampler looks at, round by round, on real sockets."""

from __future__ import annotations

import os
import socket
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

from tensorlights.discovery.sockdiag import SockDiag, TcpSocket
from tensorlights.model import DiscoverySnapshot, PsConnection, PsTask, TcpInfo
from tensorlights.telemetry.sampler import (
    FULL_ROUND_EVERY,
    START_FOR_S,
    START_INTERVAL_S,
    TelemetrySampler,
    _Target,
)

CONNECTIONS = 16


class RecordingSampler(TelemetrySampler):
    """Records the connections each round looked at."""

    def __init__(self) -> None:
        self.now = 0.0
        super().__init__(clock=lambda: self.now)
        self.rounds: list[list[str]] = []

    def _tcp_info(self, targets: list[_Target]) -> tuple[float, list[TcpInfo | None]]:
        self.rounds.append([target.key for target in targets])
        return super()._tcp_info(targets)


@contextmanager
def idle_connections(count: int) -> Iterator[list[TcpSocket]]:
    """`count` established loopback connections that send nothing: the server ends'."""
    with ExitStack() as stack, socket.create_server(("127.0.0.1", 0), backlog=count) as server:
        inodes = set()
        for _ in range(count):
            stack.enter_context(socket.create_connection(server.getsockname()))
            peer = stack.enter_context(server.accept()[0])
            inodes.add(os.fstat(peer.fileno()).st_ino)
        diag = SockDiag()
        try:
            yield diag.tcp_sockets(inodes)
        finally:
            diag.close()


def snapshot(jobs: dict[str, list[TcpSocket]]) -> DiscoverySnapshot:
    return DiscoverySnapshot(
        tasks=tuple(
            PsTask(
                pid=1000 + n,
                create_time=0.0,
                job=job,
                source="env",
                netns=0,
                in_agent_netns=True,
                listen_ports=frozenset(),
                connections=tuple(
                    PsConnection(s.local_port, s.peer_addr, s.peer_port, s.family, s.sockid)
                    for s in sockets
                ),
            )
            for n, (job, sockets) in enumerate(jobs.items())
        )
    )


def keys_of(sampler: RecordingSampler, job: str) -> list[list[str]]:
    """Per round, the keys sampled of `job` (its keys are those of its targets)."""
    assert sampler._targets is not None
    mine = {target.key for target in sampler._targets[0][job]}
    return [[key for key in keys if key in mine] for keys in sampler.rounds]


def test_a_job_that_never_pushed_has_each_connection_looked_at_once_in_ten_rounds() -> None:
    with idle_connections(CONNECTIONS) as sockets:
        assert len(sockets) == CONNECTIONS
        sampler = RecordingSampler()
        sampler.set_snapshot(snapshot({"idle": sockets}))
        sampler.sample_once()  # a job new to the sampler: all of it
        sampler.now = START_FOR_S + 1  # its connections are no longer new
        for tick in range(3 * FULL_ROUND_EVERY):
            sampler.now = START_FOR_S + 1 + tick * sampler.interval_s
            sampler.sample_once()
        rounds = keys_of(sampler, "idle")[-2 * FULL_ROUND_EVERY :]
    assert all(1 <= len(keys) <= 2 for keys in rounds), rounds  # a share each round
    for start in range(FULL_ROUND_EVERY + 1):  # any ten rounds running: each once
        seen = Counter(key for keys in rounds[start : start + FULL_ROUND_EVERY] for key in keys)
        assert len(seen) == CONNECTIONS and set(seen.values()) == {1}, (start, seen)


def test_a_job_sampled_faster_does_not_skew_another_jobs_turns() -> None:
    with idle_connections(CONNECTIONS) as idle, idle_connections(2) as new:
        sampler = RecordingSampler()
        sampler.set_snapshot(snapshot({"idle": idle}))
        sampler.sample_once()
        start = START_FOR_S + 1
        sampler.now = start
        # A job appears: it is sampled every START_INTERVAL_S, five rounds to one of the
        # idle job's (every interval_s); every round counts for it, not for the idle job.
        sampler.set_snapshot(snapshot({"idle": idle, "new": new}))
        ticks = round(4 * FULL_ROUND_EVERY * sampler.interval_s / START_INTERVAL_S)
        for tick in range(ticks):
            sampler.now = start + tick * START_INTERVAL_S
            sampler.sample_once()
        idle_rounds = [keys for keys in keys_of(sampler, "idle") if keys][-3 * FULL_ROUND_EVERY :]
        new_rounds = [keys for keys in keys_of(sampler, "new") if keys]
    assert len(new_rounds) > 3 * len(idle_rounds) // 2  # the new job was sampled faster
    for first in range(0, len(idle_rounds) - FULL_ROUND_EVERY + 1):
        window = idle_rounds[first : first + FULL_ROUND_EVERY]
        seen = Counter(key for keys in window for key in keys)
        assert len(seen) == CONNECTIONS and set(seen.values()) == {1}, (first, seen)
