"""The reconcile pass and the agent's loop around it, with a fake dataplane, a fake scanner
and a fake clock: which kernel path each pass takes, and how the loop handles errors. (The
real dataplane is tested against the kernel in tests/functional.)"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, replace

import pytest
from prometheus_client import CollectorRegistry

from tensorlights.agent.config import AgentConfig
from tensorlights.agent.loop import BACKOFF_FIRST_S, BACKOFF_MAX_S, AgentLoop, Observers
from tensorlights.agent.metrics import AgentMetrics
from tensorlights.agent.reconcile import Reconciler
from tensorlights.agent.status_server import StatusBoard
from tensorlights.daemon.health import Health
from tensorlights.daemon.sdnotify import Notifier
from tensorlights.datapath.htb import PlannedChange
from tensorlights.errors import (
    ConfigError,
    ForeignQdiscError,
    NetlinkRequestError,
    UnsupportedKernelError,
)
from tensorlights.model import DatapathSpec, DiscoverySnapshot, PsTask
from tensorlights.policy.bands import PolicyName


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class FakeDataplane:
    """Records the calls the reconciler makes; `fail` raises on the next write. `kernel`: what
    the kernel holds (set it to None for a hand deletion): writing what it holds writes
    nothing."""

    calls: list[tuple[str, object]] = field(default_factory=list)
    fail: Exception | None = None
    kernel: DatapathSpec | None = None

    def _write(self, name: str, spec: DatapathSpec) -> int:
        self.calls.append((name, spec))
        if self.fail is not None:
            raise self.fail
        if spec == self.kernel:
            return 0
        self.kernel = spec
        return len(spec.jobs) + 1

    def apply(self, spec: DatapathSpec) -> int:
        return self._write("apply", spec)

    def rotate(self, spec: DatapathSpec) -> int:
        return self._write("rotate", spec)

    def plan(self, spec: DatapathSpec) -> PlannedChange:
        self.calls.append(("plan", spec))
        return PlannedChange(False, (), {})

    def cleanup(self, interface: str) -> str:
        self.calls.append(("cleanup", interface))
        return f"{interface}: cleaned"

    def hw_offload(self, interface: str) -> None:
        return None  # no NIC here: the fake answers as a driver without ethtool features

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]


class FakeScanner:
    def __init__(self, *jobs: str) -> None:
        self.jobs = list(jobs)
        self.scans = 0
        self.news = False
        """What `changed()` answers (process events arrived, a PS opened a socket)."""
        self.polling = False
        self.checks = 0

    def changed(self) -> bool:
        self.checks += 1
        return self.news

    def polls(self) -> bool:
        return self.polling

    def scan(self) -> DiscoverySnapshot:
        self.scans += 1
        self.news = False
        return DiscoverySnapshot(
            tasks=tuple(
                PsTask(
                    pid=100 + i,
                    create_time=1.0,
                    job=job,
                    source="env",
                    netns=1,
                    in_agent_netns=True,
                    listen_ports=frozenset({5000 + i}),
                    connections=(),
                )
                for i, job in enumerate(self.jobs)
            )
        )

    def set_rules(self, rules: object) -> None:
        pass

    def close(self) -> None:
        pass


CONFIG = AgentConfig(
    "eth0",
    link_rate_bps=1_000_000_000,
    policy=PolicyName.ROTATE,
    interval_s=3.0,
    scan_interval_s=0.25,
    resync_interval_s=30.0,
    telemetry_enabled=False,
)


def _reconciler(
    config: AgentConfig = CONFIG, jobs: tuple[str, ...] = ("a", "b"), clock: Clock | None = None
) -> tuple[Reconciler, FakeDataplane, FakeScanner, Clock]:
    dataplane, scanner, clock = FakeDataplane(), FakeScanner(*jobs), clock or Clock()
    return Reconciler(config, scanner, dataplane, clock), dataplane, scanner, clock  # type: ignore[arg-type]


def test_the_first_pass_applies_then_unchanged_passes_touch_nothing() -> None:
    reconciler, dataplane, _, clock = _reconciler()
    first = reconciler.run_pass()
    assert dataplane.names() == ["apply"] and first.full_resync and first.kernel_ops == 3
    clock.now += 0.25
    second = reconciler.run_pass()
    assert dataplane.names() == ["apply"] and second.kernel_ops == 0 and not second.full_resync


def test_a_band_change_takes_the_rotation_path_and_the_resync_reads_back() -> None:
    reconciler, dataplane, _, clock = _reconciler()
    reconciler.run_pass()
    clock.now += 3.0  # the slot ends: the light moves
    moved = reconciler.run_pass()
    assert dataplane.names() == ["apply", "rotate"] and moved.plan.rotated
    clock.now += 30.0  # resync_interval since the first pass
    reconciler.run_pass()
    assert dataplane.names()[-1] == "apply"


def test_the_resync_cadence_is_resync_interval() -> None:
    config = replace(CONFIG, policy=PolicyName.STATIC)
    reconciler, dataplane, _, clock = _reconciler(config)
    applies = []
    for _ in range(int(95 / 0.25)):
        result = reconciler.run_pass()
        if result.full_resync:
            applies.append(clock.now - 1000.0)
        clock.now += 0.25
    assert applies == [0.0, 30.0, 60.0, 90.0]
    assert set(dataplane.names()) == {"apply"}


def test_an_error_forces_a_full_resync_at_the_next_pass() -> None:
    reconciler, dataplane, _, clock = _reconciler()
    reconciler.run_pass()
    reconciler.force_resync()
    clock.now += 0.25
    assert reconciler.run_pass().full_resync and dataplane.names() == ["apply", "apply"]


def test_a_kernel_change_counts_as_repaired_only_what_restores_the_last_pass() -> None:
    """A notification often follows our own deletion (a job left); the pass it wakes may have
    writes of its own to make (a job came): those are not repairs. A hand deletion is."""
    reconciler, dataplane, scanner, clock = _reconciler()
    reconciler.run_pass()
    scanner.jobs.append("c")
    scanner.news = True
    clock.now += 0.25
    joined = reconciler.run_pass(repair=True)
    assert dataplane.names() == ["apply", "apply", "rotate"]  # read back, then the news
    assert joined.repaired == 0 and joined.kernel_ops == 4 and joined.full_resync
    dataplane.kernel = None  # deleted by hand
    clock.now += 0.25
    restored = reconciler.run_pass(repair=True)
    assert restored.repaired == 4 and restored.kernel_ops == 4
    assert dataplane.names()[3:] == ["apply"]  # the spec is unchanged: nothing to rotate


def test_the_loop_warns_of_repairs_only(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    reconciler, dataplane, scanner, _ = _reconciler(clock=clock)
    app = _loop(reconciler, clock)
    app.step()
    scanner.jobs.remove("b")  # a job left: our own deletions notify
    scanner.news = True
    clock.now += 0.25
    app.step()
    app.loop.request_resync("something of ours was deleted in nftables")
    scanner.jobs.append("c")  # the pass the notification wakes has writes of its own
    scanner.news = True
    clock.now += 0.25
    app.step()
    assert "repaired" not in caplog.text
    dataplane.kernel = None
    app.loop.request_resync("a tc object of ours was deleted or our root qdisc replaced")
    clock.now += 0.25
    app.step()
    assert caplog.messages == [
        "a tc object of ours was deleted or our root qdisc replaced: repaired (3 kernel writes)"
    ]


def test_fifo_cleans_up_once_and_then_only_observes() -> None:
    reconciler, dataplane, _, clock = _reconciler(replace(CONFIG, policy=PolicyName.FIFO))
    for _ in range(5):
        result = reconciler.run_pass()
        assert result.spec is None
        clock.now += 0.25
    assert dataplane.names() == ["cleanup"]


def test_a_pass_woken_at_the_slot_boundary_reuses_a_fresh_scan() -> None:
    reconciler, _, scanner, clock = _reconciler()
    reconciler.run_pass()
    clock.now += 0.1  # under scan_interval / 2: woken early for the light, not a new scan
    reconciler.run_pass()
    assert scanner.scans == 1
    clock.now += 0.2
    reconciler.run_pass()
    assert scanner.scans == 2


def test_at_the_slot_boundary_the_light_moves_before_the_scan_due_then() -> None:
    """A scan (socket dumps, a sweep of /proc) ahead of the switch would make this host's
    switch late against the job's other hosts: it follows in the next pass, run at once."""
    reconciler, dataplane, scanner, clock = _reconciler()
    first = reconciler.run_pass()
    assert first.plan.next_change_at is not None
    clock.now = first.plan.next_change_at
    moved = reconciler.run_pass()
    assert moved.plan.rotated and moved.plan.green != first.plan.green
    assert dataplane.names() == ["apply", "rotate"] and scanner.scans == 1 and moved.deferred
    after = reconciler.run_pass()
    assert scanner.scans == 2 and not after.deferred and not after.plan.rotated
    assert dataplane.names() == ["apply", "rotate"]  # the same light: nothing to write


def test_news_at_the_slot_boundary_is_scanned_first() -> None:
    reconciler, _, scanner, clock = _reconciler()
    first = reconciler.run_pass()
    assert first.plan.next_change_at is not None
    clock.now = first.plan.next_change_at
    scanner.news = True  # a job may have come or gone: the light must not go to a dead one
    moved = reconciler.run_pass()
    assert scanner.scans == 2 and moved.plan.rotated and not moved.deferred


def test_a_full_resync_due_at_the_slot_boundary_follows_the_switch() -> None:
    reconciler, dataplane, _, clock = _reconciler(replace(CONFIG, resync_interval_s=3.0))
    first = reconciler.run_pass()
    assert first.plan.next_change_at is not None
    clock.now = first.plan.next_change_at  # the resync is due now too
    moved = reconciler.run_pass()
    assert moved.deferred and not moved.full_resync and dataplane.names() == ["apply", "rotate"]
    resynced = reconciler.run_pass()
    assert resynced.full_resync and not resynced.deferred
    assert dataplane.names() == ["apply", "rotate", "apply"]


def test_the_rotation_is_applied_when_its_kernel_write_is_done() -> None:
    clock = Clock()
    reconciler, dataplane, _, _ = _reconciler(clock=clock)
    write = dataplane.rotate

    def slow_rotate(spec: DatapathSpec) -> int:
        clock.now += 0.04  # the write took 40 ms
        return write(spec)

    dataplane.rotate = slow_rotate  # type: ignore[method-assign]
    app = _loop(reconciler, clock)
    for _ in range(50):  # passes at the loop's cadence until one at the slot boundary
        started = clock.now
        wait_s = app.step()
        if wait_s == 0.0:
            break  # the light moved ahead of the scan: the next pass scans at once
        clock.now += wait_s
    assert wait_s == 0.0 and dataplane.names()[-1] == "rotate"
    recent = app.board.document()["rotations"]["recent"]
    assert recent[-1]["applied"] == pytest.approx(started + 0.04)


def test_a_pass_woken_early_by_discovery_news_scans_again() -> None:
    reconciler, _, scanner, clock = _reconciler()
    reconciler.run_pass()
    clock.now += 0.1
    scanner.news = True  # e.g. a process exec()ed: the process events woke the loop
    reconciler.run_pass()
    assert scanner.scans == 2


def test_rotate_wakes_the_loop_at_the_slot_boundary() -> None:
    reconciler, _, _, clock = _reconciler()
    result = reconciler.run_pass()
    assert result.plan.next_change_at == pytest.approx(clock.now + 3.0)


def test_a_job_arriving_takes_the_rotation_path_which_the_dataplane_widens() -> None:
    reconciler, dataplane, scanner, clock = _reconciler()
    reconciler.run_pass()
    scanner.jobs.append("c")
    clock.now += 0.25
    reconciler.run_pass()
    name, spec = dataplane.calls[-1]
    assert name == "rotate" and isinstance(spec, DatapathSpec) and len(spec.jobs) == 3


def test_stop_restores_or_leaves() -> None:
    reconciler, dataplane, _, _ = _reconciler()
    assert reconciler.stop(restore=False) is None and dataplane.names() == []
    assert reconciler.stop(restore=True) == "eth0: cleaned"


def test_dry_run_plans_and_writes_nothing() -> None:
    reconciler, dataplane, _, _ = _reconciler()
    plan, spec, change = reconciler.dry_run()
    assert spec is not None and change is not None and dataplane.names() == ["plan"]
    assert plan.green == "a"


# The loop ------------------------------------------------------------------------------


@dataclass
class Loop:
    loop: AgentLoop
    registry: CollectorRegistry
    health: Health
    board: StatusBoard

    def step(self) -> float:
        return self.loop.step()

    def errors(self, kind: str) -> float:
        name = "tensorlights_reconcile_errors_total"
        return self.registry.get_sample_value(name, {"kind": kind}) or 0.0


def _loop(reconciler: Reconciler, clock: Clock) -> Loop:
    registry = CollectorRegistry()
    health = Health(CONFIG.health_max_age_s, clock)
    board = StatusBoard()
    observers = Observers(AgentMetrics(registry), health, Notifier(None), board)
    return Loop(AgentLoop(CONFIG, reconciler, observers, clock, clock), registry, health, board)


def _waited(scanner: FakeScanner, wait_s: float) -> tuple[float, int]:
    """How long the loop's wait between passes took (real time), and the checks it made."""
    reconciler, _, _, _ = _reconciler()
    reconciler._scanner = scanner  # type: ignore[assignment]
    loop = _loop(reconciler, Clock())
    loop.loop._clock = time.monotonic
    start = time.monotonic()
    loop.loop._wait(wait_s, threading.Event(), threading.Event())
    return time.monotonic() - start, scanner.checks


def test_between_passes_the_loop_polls_discovery_only_while_it_asks() -> None:
    quiet = FakeScanner("a")
    waited, checks = _waited(quiet, 0.35)
    assert waited >= 0.35 and checks == 0  # no polls wanted: one wait to the deadline
    polled = FakeScanner("a")
    polled.polling = True
    waited, checks = _waited(polled, 0.35)
    assert waited >= 0.35 and checks == 3  # every poll_interval (100 ms) until the deadline
    news = FakeScanner("a")
    news.polling = news.news = True
    waited, checks = _waited(news, 5.0)
    assert waited < 1.0 and checks == 1  # the first poll found news: the pass is due now


def test_transient_errors_back_off_doubling_to_the_cap_and_recover() -> None:
    clock = Clock()
    reconciler, dataplane, _, _ = _reconciler(clock=clock)
    app = _loop(reconciler, clock)
    dataplane.fail = ForeignQdiscError("eth0 already has a root qdisc tbf 5:0")
    waits = []
    for _ in range(7):  # retried even before the first good pass: the host may change
        waits.append(app.step())
        clock.now += waits[-1]
    assert waits == [0.5, 1.0, 2.0, 4.0, 8.0, BACKOFF_MAX_S, BACKOFF_MAX_S]
    assert waits[0] == BACKOFF_FIRST_S and app.errors("ForeignQdiscError") == 7
    healthy, reason = app.health.check()  # 35.5 s without a good pass
    assert not healthy and "ForeignQdiscError" in reason
    dataplane.fail = None
    assert app.step() == CONFIG.scan_interval_s  # recovered: the normal cadence
    assert app.health.check()[0]
    assert dataplane.names() == ["apply"] * 8  # every failure forced a full resync
    dataplane.fail = ForeignQdiscError("again")
    clock.now += CONFIG.resync_interval_s  # the next full resync meets it
    assert app.step() == BACKOFF_FIRST_S  # the backoff starts over


@pytest.mark.parametrize(
    "error",
    [
        UnsupportedKernelError("no HTB in this kernel"),
        NetlinkRequestError("add class", 1, "Operation not permitted"),
        ConfigError("bad"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_a_permanent_error_on_the_first_pass_is_fatal(error: Exception) -> None:
    clock = Clock()
    reconciler, dataplane, _, _ = _reconciler(clock=clock)
    app = _loop(reconciler, clock)
    dataplane.fail = error
    with pytest.raises(type(error)):
        app.step()


def test_a_permanent_error_after_a_good_pass_is_retried() -> None:
    clock = Clock()
    reconciler, dataplane, _, _ = _reconciler(clock=clock)
    app = _loop(reconciler, clock)
    app.step()
    dataplane.fail = NetlinkRequestError("change class", 22, "Invalid argument")
    clock.now += 3.0
    assert app.step() == BACKOFF_FIRST_S
    assert app.errors("NetlinkRequestError") == 1
    clock.now += 11.0  # past health_max_age without a good pass
    healthy, reason = app.health.check()
    assert not healthy and "NetlinkRequestError" in reason


def test_plans_older_than_the_followed_one_are_ignored() -> None:
    from tensorlights.policy.schedule import HostSchedule

    reconciler, _, _, clock = _reconciler()
    newer = HostSchedule(1, 5, 0.0, 3.0, (("b", "a"),), lease_until=clock.now + 15)
    older = HostSchedule(1, 4, 0.0, 3.0, (("a", "b"),), lease_until=clock.now + 15)
    assert reconciler.offer_plan(newer) and not reconciler.offer_plan(older)
    assert reconciler.run_pass().plan.green == "b"


def test_the_loop_publishes_a_typed_status_that_reads_back_as_it_was_sent() -> None:
    import json

    from tensorlights.agent.status import AgentStatus

    clock = Clock()
    reconciler, _, _, _ = _reconciler(clock=clock)
    app = _loop(reconciler, clock)
    assert app.board.document() == {"state": "starting"}
    app.step()
    clock.now += 3.0
    app.step()  # the light moves: a rotation is recorded
    sent = json.loads(app.board.encoded())
    status = AgentStatus.from_json(sent)
    assert json.loads(json.dumps(status.to_json(), sort_keys=True)) == sent
    assert status.shaping is not None and status.shaping.bands == {"b": 0, "a": 1}
    assert status.shaping.light.green == "b" and status.shaping.light.next == "a"
    assert [r.job for r in status.recent_rotations] == ["a", "b"]
    assert sent["rotations"]["green"] == "b" and sent["mode"] == "local"  # the JSON keys
    assert status.telemetry is None and "telemetry" not in sent  # telemetry off


def test_a_job_that_ends_while_green_leaves_no_metric_series() -> None:
    """Labels stay bounded: a job gone from the host has no series, even the one that held
    the green light when it ended (it used to be re-created by its last green interval)."""
    clock = Clock()
    reconciler, _, scanner, _ = _reconciler(clock=clock)
    app = _loop(reconciler, clock)
    app.step()
    clock.now += 0.25
    app.step()
    green = "tensorlights_green_seconds_total"
    assert app.registry.get_sample_value(green, {"training_job": "a"}) == pytest.approx(0.25)
    scanner.jobs.remove("a")  # the green job ends
    clock.now += 0.25
    app.step()
    assert app.registry.get_sample_value(green, {"training_job": "a"}) is None
    assert app.registry.get_sample_value("tensorlights_job_band", {"training_job": "a"}) is None
    assert app.registry.get_sample_value("tensorlights_job_band", {"training_job": "b"}) == 0
