"""The agent's loop: one pass, its errors and backoff, then a wait (until the next scan, the
light's next move or a wake-up), and sd_notify. What a pass produced goes to the metrics, the
controller link and the status board; nothing here builds or owns those.

Errors (errors.py): before the first good pass a PermanentError is fatal (raised to the app,
exit 1). Transient errors, and once a pass has succeeded every error, are retried: back off
0.5 s doubling to 10 s, resync the kernel state at the next pass, /healthz says why.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from tensorlights.agent.config import AgentConfig
from tensorlights.agent.link import ControllerBinding
from tensorlights.agent.metrics import AgentMetrics
from tensorlights.agent.publish import LiveParts, PassRecord, build_status
from tensorlights.agent.reconcile import PassResult, Reconciler
from tensorlights.agent.rotations import RotationLog
from tensorlights.agent.status_server import StatusBoard
from tensorlights.daemon.health import Health
from tensorlights.daemon.sdnotify import Notifier
from tensorlights.errors import TensorLightsError, TransientError
from tensorlights.model import AppliedRotation
from tensorlights.telemetry.sampler import TelemetrySampler

log = logging.getLogger("tensorlights.agent")

BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 10.0


@dataclass(frozen=True)
class Observers:
    """Where a pass's outcome goes."""

    metrics: AgentMetrics
    health: Health
    notifier: Notifier
    board: StatusBoard
    link: ControllerBinding | None = None
    sampler: TelemetrySampler | None = None


class AgentLoop:
    def __init__(
        self,
        config: AgentConfig,
        reconciler: Reconciler,
        observers: Observers,
        clock: Callable[[], float],
        wall_clock: Callable[[], float],
    ) -> None:
        self.config = config
        """Replaced on a reload (the app's)."""
        self.reconciler = reconciler
        self._out = observers
        self._clock = clock
        self._wall = wall_clock
        self._backoff_s = 0.0
        self._last_pass: PassResult | None = None
        self._last_error = ""
        self._rotations = RotationLog()
        self._kernel_changed = threading.Event()
        self._change_reason = ""

    def request_resync(self, reason: str) -> None:
        """From any thread: the kernel changed under us; the next pass reads it back whole."""
        self._change_reason = reason
        self._kernel_changed.set()

    def run(self, stop: threading.Event, wake: threading.Event, before: Callable[[], None]) -> None:
        """Passes until `stop`; `before` runs ahead of each (the app's reload check)."""
        ready = False
        while not stop.is_set():
            before()
            wait_s = self.step()
            if not ready and self._last_pass is not None:
                self._out.notifier.send(READY="1", STATUS=f"reconciling {self.config.interface}")
                ready = True
            self._out.notifier.send(WATCHDOG="1")
            self._wait(wait_s, stop, wake)
            wake.clear()

    def _wait(self, wait_s: float, stop: threading.Event, wake: threading.Event) -> None:
        """Until the next pass is due, a wake-up (process events, a plan, a signal), or, polled
        every poll_interval while discovery wants it, discovery has news."""
        deadline = self._clock() + wait_s
        while not stop.is_set():
            left = deadline - self._clock()
            if left <= 0:
                return
            polls = self._backoff_s == 0 and self.reconciler.discovery_polls()
            if wake.wait(min(left, self.config.poll_interval_s) if polls else left):
                return
            if polls and self._clock() < deadline and self.reconciler.discovery_changed():
                return

    def step(self) -> float:
        """One pass with its error handling; how long to wait before the next."""
        changed = ""
        if self._kernel_changed.is_set():
            self._kernel_changed.clear()
            changed = self._change_reason  # often our own rotation: said only if repaired
        link = self._out.link
        for plan in link.take_plans() if link is not None else ():
            if not self.reconciler.offer_plan(plan):
                log.warning("ignored a plan older than the one followed (a replay)")
        renewal = link.take_renewal() if link is not None else None
        if renewal is not None:
            self.reconciler.renew_plan(*renewal)
        vouchers = link.take_vouchers() if link is not None else None
        if vouchers is not None:
            self.reconciler.offer_vouchers(vouchers)
        try:
            with self._out.metrics.reconcile_duration.time():
                result = self.reconciler.run_pass(repair=bool(changed))
        except (TransientError, OSError) as exc:
            return self._failed(exc)
        except TensorLightsError as exc:
            if self._last_pass is None:
                raise  # the first pass fails permanently: configuration, kernel support
            return self._failed(exc)  # it worked before: the host changed (errors.py)
        if result.repaired:
            log.warning("%s: repaired (%d kernel writes)", changed, result.repaired)
        self._succeeded(result)
        if result.deferred:
            return 0.0  # the scan or resync the light went ahead of (Reconciler.run_pass)
        wait_s = self.config.scan_interval_s
        if result.plan.next_change_at is not None:
            wait_s = min(wait_s, max(0.0, result.plan.next_change_at - self._clock()))
        return wait_s

    def _failed(self, exc: BaseException) -> float:
        kind = type(exc).__name__
        self._out.metrics.observe_failure(kind)
        message = f"{kind}: {exc}"
        if message != self._last_error:
            log.warning("reconcile failed (will retry): %s", message)
        self._last_error = message
        self._out.health.failure(message)
        if self._out.link is not None:
            self._out.link.failed(message)
        self.reconciler.force_resync()
        self._backoff_s = min(BACKOFF_MAX_S, max(BACKOFF_FIRST_S, self._backoff_s * 2))
        self.publish()
        return self._backoff_s

    def _succeeded(self, result: PassResult) -> None:
        previous, self._last_pass = self._last_pass, result
        if self._last_error:
            log.info("reconcile recovered")
        self._last_error = ""
        self._backoff_s = 0.0
        out = self._out
        out.health.success()
        out.metrics.observe_pass(previous, result, self._wall())
        applied = self._rotations.record(result, self._wall() - self._clock())
        if applied is not None:
            log.info("green light -> %s", applied.job)
            if out.link is not None:
                out.link.applied(AppliedRotation(applied.job, applied.applied, applied.plan))
        seen = set(previous.snapshot.problems) if previous is not None else set()
        for problem in set(result.snapshot.problems) - seen:
            log.warning("discovery: %s", problem)
        if out.sampler is not None:
            out.sampler.set_snapshot(result.snapshot, result.pods)
        if out.link is not None:
            out.link.passed(result, out.sampler.recent() if out.sampler else None)
        self.publish()

    def publish(self) -> None:
        """Hand the status socket an immutable record of this pass; the status is built from
        it (and the live health, link and telemetry) only when someone asks."""
        record = PassRecord(
            self.config,
            self._last_pass,
            self._last_error,
            self._rotations.recent,
            self._wall() - self._clock(),
        )
        sampler, link = self._out.sampler, self._out.link
        live = LiveParts(
            health=self._out.health.check,
            link=link.view if link is not None else None,
            telemetry=(lambda: (sampler.recent(), sampler.last_error)) if sampler else None,
        )
        self._out.board.publish(lambda: build_status(record, live).to_json())
