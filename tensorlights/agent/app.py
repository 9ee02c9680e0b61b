"""The agent's composition root: config, clocks, registry and servers are built here and
passed down; the reconcile loop runs on the main thread.

Lifecycle:
  start   config validated (exit 2 on error, nothing programmed) -> interface checked ->
          servers bound -> first pass -> READY=1
  loop    one pass every scan_interval, woken early when the light is due to move; WATCHDOG=1
          after every pass that completed (the loop is alive), /healthz from successful passes
  errors  before the first good pass: a PermanentError is fatal (exit 1; systemd restarts
          the unit). Transient errors, and once a pass has succeeded every error: back off
          (0.5 s doubling to 10 s), resync, /healthz 503 with the reason (errors.py)
  SIGHUP  reload the config file: validated first; on error the old config stays
  SIGTERM restore the interface (on_stop = restore, the default) or leave the shaping for the
          next start to adopt (on_stop = leave); exit 0
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Mapping
from types import FrameType
from typing import Any

from prometheus_client import CollectorRegistry

from tensorlights import __version__
from tensorlights.agent.config import AgentConfig, OnStop, OnUnsupported, build_config
from tensorlights.agent.config import with_link_rate as _with_link_rate
from tensorlights.agent.link import ControllerBinding
from tensorlights.agent.metrics import AgentMetrics, KernelCounters
from tensorlights.agent.publish import LiveParts, PassRecord, build_status
from tensorlights.agent.reconcile import PassResult, Reconciler
from tensorlights.agent.rotations import RotationLog
from tensorlights.agent.status_server import StatusBoard, StatusServer
from tensorlights.daemon.health import Health
from tensorlights.daemon.http import MetricsServer
from tensorlights.daemon.sdnotify import Notifier
from tensorlights.datapath import open_datapath
from tensorlights.datapath.dataplane import Dataplane, Marking
from tensorlights.discovery.scanner import Scanner
from tensorlights.errors import PermanentError, TensorLightsError, TransientError
from tensorlights.model import AppliedRotation
from tensorlights.telemetry.sampler import TelemetrySampler

log = logging.getLogger("tensorlights.agent")

BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 10.0


def marking(config: AgentConfig) -> Marking | None:
    """DSCP marking as configured (None: off)."""
    if not config.dscp_enabled:
        return None
    return Marking(config.dscp_bands, required=config.dscp_on_unsupported is OnUnsupported.ERROR)


class AgentApp:
    def __init__(
        self,
        load_config: Callable[[], AgentConfig],
        registry: CollectorRegistry,
        notifier: Notifier,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._load_config = load_config
        self.config = _with_link_rate(load_config())
        self.registry = registry
        self.metrics = AgentMetrics(registry)
        self.notifier = notifier
        self._clock = clock
        self._wall = wall_clock
        self.health = Health(self.config.health_max_age_s, clock)
        self.board = StatusBoard()
        self._stop = threading.Event()
        self._reload = threading.Event()
        self._wake = threading.Event()
        self._backoff_s = 0.0
        self._last_pass: PassResult | None = None
        self._last_error = ""
        self._rotations = RotationLog()
        self._sampler: TelemetrySampler | None = None
        self._link: ControllerBinding | None = None
        self._dataplane: Dataplane | None = None
        self._incarnation = time.time_ns()

    # Signals ---------------------------------------------------------------------------

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, self._on_stop_signal)
        signal.signal(signal.SIGINT, self._on_stop_signal)
        signal.signal(signal.SIGHUP, self._on_reload_signal)

    def _on_stop_signal(self, signum: int, frame: FrameType | None) -> None:
        self.request_stop()

    def _on_reload_signal(self, signum: int, frame: FrameType | None) -> None:
        self._reload.set()
        self._wake.set()

    def request_stop(self) -> None:
        self._stop.set()
        self._wake.set()

    # Main ------------------------------------------------------------------------------

    def run(self) -> int:
        config = self.config
        tc = open_datapath(
            "htb", config.state_dir, take_over_foreign=config.take_over_foreign_qdisc
        )
        tc.link(config.interface)  # InterfaceNotFoundError now, before anything else
        dataplane = self._dataplane = Dataplane(tc, marking=marking(config))
        self.metrics.dscp_enabled.set(dataplane.marking)
        scanner = Scanner(config.discovery)
        sampler = self._sampler = self._make_sampler(config)
        loads = (lambda: sampler.loads(self.config.link_rate_bps or 1)) if sampler else dict
        reconciler = Reconciler(config, scanner, dataplane, self._clock, loads)
        metrics_server = MetricsServer(config.metrics_address, self.registry, self.health)
        status_server = StatusServer(config.status_socket, self.board)
        self.registry.register(
            KernelCounters(
                lambda: dataplane.class_counters(self.config.interface),
                sampler.sent_counters if sampler is not None else dict,
            )
        )
        metrics_server.start()
        status_server.start()
        if sampler is not None:
            sampler.start()
        self.metrics.controller_connected.set(0)
        if not config.standalone:
            self._link = ControllerBinding(
                config,
                self._incarnation,
                self._clock,
                self._wall,
                self._wake.set,
                self.metrics.controller_connected.set,
            )
            self._link.start()
        log.info(
            "tensorlights-agent %s on %s: policy %s, interval %.3gs, metrics on %s:%d",
            __version__,
            config.interface,
            config.policy.value,
            config.interval_s,
            *metrics_server.address,
        )
        code = 0
        try:
            self._loop(reconciler)
        except PermanentError as exc:
            log.error("stopping: %s", exc)
            self.notifier.send(STATUS=f"failed: {exc}")
            code = 1
        else:
            self.notifier.send(STOPPING="1")
        restore = code == 0 and self.config.on_stop is OnStop.RESTORE
        try:
            outcome = reconciler.stop(restore)
            if outcome:
                log.info("%s", outcome)
            elif not restore and code == 0:
                log.info("leaving the shaping on %s for the next start", self.config.interface)
        except TensorLightsError as exc:
            log.error("could not restore %s: %s", self.config.interface, exc)
        finally:
            for close in (
                self._link.stop if self._link is not None else None,
                sampler.stop if sampler is not None else None,
                status_server.close,
                metrics_server.close,
                scanner.close,
                dataplane.close,
                self.notifier.close,
            ):
                if close is not None:
                    close()
        return code

    def _loop(self, reconciler: Reconciler) -> None:
        """One pass, then wait: until the next scan, the light's next move, or a wake-up."""
        ready = False
        while not self._stop.is_set():
            if self._reload.is_set():
                self._reload.clear()
                self._reload_config(reconciler)
            wait_s = self.step(reconciler)
            if not ready and self._last_pass is not None:
                self.notifier.send(READY="1", STATUS=f"reconciling {self.config.interface}")
                ready = True
            self.notifier.send(WATCHDOG="1")
            self._wake.wait(wait_s)
            self._wake.clear()

    def _make_sampler(self, config: AgentConfig) -> TelemetrySampler | None:
        if not config.telemetry_enabled:
            return None
        return TelemetrySampler(
            config.telemetry_sample_interval_s,
            config.telemetry_min_push_bytes,
            self.metrics.observe_iteration,
            self._clock,
        )

    def step(self, reconciler: Reconciler) -> float:
        """One pass with its error handling; how long to wait before the next."""
        for plan in self._link.take_plans() if self._link is not None else ():
            if not reconciler.offer_plan(plan):
                log.warning("ignored a plan older than the one followed (a replay)")
        try:
            with self.metrics.reconcile_duration.time():
                result = reconciler.run_pass()
        except (TransientError, OSError) as exc:
            self._failed(reconciler, exc)
            return self._backoff_s
        except TensorLightsError as exc:
            if self._last_pass is None:
                raise  # the first pass fails permanently: configuration, kernel support
            self._failed(reconciler, exc)  # it worked before: the host changed (errors.py)
            return self._backoff_s
        self._succeeded(result)
        wait_s = self.config.scan_interval_s
        if result.plan.next_change_at is not None:
            wait_s = min(wait_s, max(0.0, result.plan.next_change_at - self._clock()))
        return wait_s

    def _failed(self, reconciler: Reconciler, exc: BaseException) -> None:
        kind = type(exc).__name__
        self.metrics.observe_failure(kind)
        message = f"{kind}: {exc}"
        if message != self._last_error:
            log.warning("reconcile failed (will retry): %s", message)
        self._last_error = message
        self.health.failure(message)
        if self._link is not None:
            self._link.failed(message)
        reconciler.force_resync()
        self._backoff_s = min(BACKOFF_MAX_S, max(BACKOFF_FIRST_S, self._backoff_s * 2))
        self._publish()

    def _succeeded(self, result: PassResult) -> None:
        previous, self._last_pass = self._last_pass, result
        if self._last_error:
            log.info("reconcile recovered")
        self._last_error = ""
        self._backoff_s = 0.0
        self.health.success()
        self.metrics.observe_pass(previous, result, self._wall())
        applied = self._rotations.record(result, self._wall() - self._clock(), self._wall())
        if applied is not None:
            log.info("green light -> %s", applied.job)
            if self._link is not None:
                self._link.applied(AppliedRotation(applied.job, applied.applied, applied.plan))
        seen = set(previous.snapshot.problems) if previous is not None else set()
        for problem in set(result.snapshot.problems) - seen:
            log.warning("discovery: %s", problem)
        if self._sampler is not None:
            self._sampler.set_snapshot(result.snapshot)
        if self._link is not None:
            self._link.passed(result, self._sampler.recent() if self._sampler else None)
        self._publish()

    def _reload_config(self, reconciler: Reconciler) -> None:
        try:
            config = _with_link_rate(self._load_config())
        except TensorLightsError as exc:
            log.error("config reload refused, keeping the running config: %s", exc)
            return
        if config.metrics_address != self.config.metrics_address or (
            config.status_socket != self.config.status_socket
        ):
            log.warning("metrics_address and status_socket changes take effect at restart")
        reconciler.reconfigure(config)
        if self._dataplane is not None:
            try:
                self._dataplane.set_marking(marking(config))
            except TensorLightsError as exc:
                log.error("DSCP marking stays off: %s", exc)
            self.metrics.dscp_enabled.set(self._dataplane.marking)
        self.config = config
        self.health.max_age_s = config.health_max_age_s
        log.info("config reloaded: policy %s, interval %.3gs", config.policy, config.interval_s)

    def _publish(self) -> None:
        """Hand the status socket an immutable record of this pass; the status is built from
        it (and the live health, link and telemetry) only when someone asks."""
        record = PassRecord(
            self.config,
            self._last_pass,
            self._last_error,
            self._rotations.recent,
            self._wall() - self._clock(),
        )
        sampler, link = self._sampler, self._link
        live = LiveParts(
            health=self.health.check,
            link=link.view if link is not None else None,
            telemetry=(lambda: (sampler.recent(), sampler.last_error)) if sampler else None,
        )
        self.board.publish(lambda: build_status(record, live).to_json())


def load_config_function(
    file_reader: Callable[[], Mapping[str, Any]], overrides: Mapping[str, Any]
) -> Callable[[], AgentConfig]:
    """A loader that re-reads the file each call (SIGHUP) with the command line on top."""

    def load() -> AgentConfig:
        return build_config(file_reader(), overrides)

    return load
