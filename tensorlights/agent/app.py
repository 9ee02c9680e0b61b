"""The agent's composition root: config, clocks, registry and servers are built here and
passed down; the reconcile loop runs on the main thread.

Lifecycle:
  start   config validated (exit 2 on error, nothing programmed) -> interface checked ->
          servers bound -> first pass -> READY=1
  loop    one pass every scan_interval, woken early when the light is due to move; WATCHDOG=1
          after every pass that completed (the loop is alive), /healthz from successful passes
  errors  transient or "interface gone" -> back off (0.5 s doubling to 10 s) and resync;
          another permanent error -> message, exit 1 (systemd restarts the unit)
  SIGHUP  reload the config file: validated first; on error the old config stays
  SIGTERM restore the interface (on_stop = restore, the default) or leave the shaping for the
          next start to adopt (on_stop = leave); exit 0
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import signal
import statistics
import threading
import time
from collections.abc import Callable, Mapping
from types import FrameType
from typing import Any

from prometheus_client import CollectorRegistry

from tensorlights import __version__
from tensorlights.agent.config import (
    AgentConfig,
    OnStop,
    OnUnsupported,
    build_config,
    with_link_rate,
)
from tensorlights.agent.metrics import AgentMetrics, KernelCounters
from tensorlights.agent.reconcile import PassResult, Reconciler, shaped_jobs
from tensorlights.agent.status import StatusBoard, StatusServer
from tensorlights.daemon.health import Health
from tensorlights.daemon.http import MetricsServer
from tensorlights.daemon.sdnotify import Notifier
from tensorlights.datapath import open_datapath
from tensorlights.datapath.dscp import DscpMarker
from tensorlights.datapath.nft import Nft
from tensorlights.discovery.scanner import Scanner
from tensorlights.errors import (
    ForeignQdiscError,
    InterfaceNotFoundError,
    PermanentError,
    TensorLightsError,
    TransientError,
    UnsupportedKernelError,
)
from tensorlights.model import (
    AppliedRotation,
    PlanSlots,
    Registration,
    ReportedJob,
)
from tensorlights.policy.bands import PolicyName
from tensorlights.policy.schedule import HostSchedule
from tensorlights.rpc.agent_client import ControllerLink
from tensorlights.telemetry.sampler import TelemetrySampler
from tensorlights.views import snapshot_view

log = logging.getLogger("tensorlights.agent")

BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 10.0


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
        self.config = with_link_rate(load_config())
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
        self._history: list[dict[str, Any]] = []
        self._sampler: TelemetrySampler | None = None
        self._reconciler: Reconciler | None = None
        self._link: ControllerLink | None = None
        self._plans: queue.SimpleQueue[HostSchedule] = queue.SimpleQueue()
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
        datapath = open_datapath(
            "htb", config.state_dir, take_over_foreign=config.take_over_foreign_qdisc
        )
        datapath.link(config.interface)  # InterfaceNotFoundError now, before anything else
        marker = self._make_marker(config)
        scanner = Scanner(config.discovery)
        reconciler = Reconciler(config, scanner, datapath, self._clock, marker)
        self._reconciler = reconciler
        metrics_server = MetricsServer(config.metrics_address, self.registry, self.health)
        status_server = StatusServer(config.status_socket, self.board)
        sampler = self._make_sampler(config)
        self.registry.register(
            KernelCounters(
                lambda: datapath.class_counters(self.config.interface),
                sampler.sent_counters if sampler is not None else dict,
            )
        )
        self._sampler = sampler
        if sampler is not None:
            reconciler.loads = lambda: sampler.loads(self.config.link_rate_bps or 1)
        metrics_server.start()
        status_server.start()
        if sampler is not None:
            sampler.start()
        self.metrics.controller_connected.set(0)
        self._link = self._make_link(config)
        if self._link is not None:
            self._link.start()
        log.info(
            "tensorlights-agent %s on %s: policy %s, interval %.3gs, metrics on %s:%d",
            __version__,
            config.interface,
            config.policy.value,
            config.interval_s,
            *metrics_server.address,
        )
        ready = False
        try:
            while not self._stop.is_set():
                if self._reload.is_set():
                    self._reload.clear()
                    self._reload_config(reconciler)
                wait_s = self._one_pass(reconciler)
                if not ready and self._last_pass is not None:
                    self.notifier.send(READY="1", STATUS=f"reconciling {self.config.interface}")
                    ready = True
                self.notifier.send(WATCHDOG="1")
                self._wake.wait(wait_s)
                self._wake.clear()
        except PermanentError as exc:
            log.error("stopping: %s", exc)
            self.notifier.send(STATUS=f"failed: {exc}")
            self._shutdown(reconciler, scanner, metrics_server, status_server, restore=False)
            return 1
        self.notifier.send(STOPPING="1")
        restore = self.config.on_stop is OnStop.RESTORE
        self._shutdown(reconciler, scanner, metrics_server, status_server, restore=restore)
        return 0

    def _make_sampler(self, config: AgentConfig) -> TelemetrySampler | None:
        if not config.telemetry_enabled:
            return None
        return TelemetrySampler(
            config.telemetry_sample_interval_s,
            config.telemetry_min_push_bytes,
            self.metrics.observe_iteration,
            self._clock,
        )

    def _make_link(self, config: AgentConfig) -> ControllerLink | None:
        if config.standalone:
            return None
        assert config.controller is not None and config.controller_tls is not None
        link_rate = config.link_rate_bps or 0
        registration = Registration(
            host=config.host_name,
            incarnation=self._incarnation,
            agent_version=__version__,
            interfaces=((config.interface, link_rate),),
            fallback_policy=config.policy.value,
        )
        return ControllerLink(
            config.controller,
            config.controller_tls,
            config.controller_server_name,
            registration,
            self._plan_received,
            lambda state: self.metrics.controller_connected.set(state.state == "connected"),
        )

    def _plan_received(self, plan: PlanSlots) -> None:
        """On the link's thread: times moved to our monotonic clock as the plan arrives."""
        now = self._clock()
        offset = self._wall() - now
        self._plans.put(
            HostSchedule(
                incarnation=plan.incarnation,
                generation=plan.generation,
                epoch=plan.epoch - offset,
                slot_s=plan.slot_s,
                slots=plan.slots,
                lease_until=now + plan.lease_s,
            )
        )
        self._wake.set()

    def _make_marker(self, config: AgentConfig) -> DscpMarker | None:
        """DSCP marking as configured; off with a loud warning only if the config says so."""
        self.metrics.dscp_enabled.set(0)
        if not config.dscp_enabled:
            return None
        try:
            marker = DscpMarker(Nft())
            marker.probe()
        except UnsupportedKernelError as exc:
            if config.dscp_on_unsupported is OnUnsupported.WARN:
                log.warning("DSCP MARKING IS OFF (dscp.on_unsupported = warn): %s", exc)
                return None
            raise
        self.metrics.dscp_enabled.set(1)
        return marker

    def _one_pass(self, reconciler: Reconciler) -> float:
        """Run a pass; how long to wait before the next."""
        config = self.config
        while not self._plans.empty():
            if not reconciler.policy.offer(self._plans.get_nowait()):
                log.warning("ignored a plan older than the one followed (a replay)")
        try:
            with self.metrics.reconcile_duration.time():
                result = reconciler.run_pass()
        except (TransientError, InterfaceNotFoundError, ForeignQdiscError, OSError) as exc:
            self._failed(reconciler, exc)
            return self._backoff_s
        except TensorLightsError as exc:
            if self._last_pass is None:
                raise  # the first pass fails permanently: configuration, kernel support
            self._failed(reconciler, exc)
            return self._backoff_s
        self._succeeded(result)
        wait_s = config.scan_interval_s
        if result.plan.next_change_at is not None:
            wait_s = min(wait_s, max(0.0, result.plan.next_change_at - self._clock()))
        return wait_s

    def _failed(self, reconciler: Reconciler, exc: BaseException) -> None:
        kind = type(exc).__name__
        self.metrics.errors.labels(kind).inc()
        message = f"{kind}: {exc}"
        if message != self._last_error:
            log.warning("reconcile failed (will retry): %s", message)
        self._last_error = message
        self.health.failure(message)
        if self._link is not None:
            self._link.update((), "local", message)
        reconciler.force_resync()
        self._backoff_s = min(BACKOFF_MAX_S, max(BACKOFF_FIRST_S, self._backoff_s * 2))
        self._publish()

    def _succeeded(self, result: PassResult) -> None:
        previous = self._last_pass
        if self._last_error:
            log.info("reconcile recovered")
        self._last_error = ""
        self._backoff_s = 0.0
        self.health.success()
        self.metrics.last_success.set(self._wall())
        self.metrics.scan_duration.observe(result.scan_s)
        self.metrics.kernel_ops.inc(result.kernel_ops)
        self.metrics.ps_processes.set(len(result.snapshot.tasks))
        self.metrics.problems.set(len(result.snapshot.problems))
        green_for = 0.0
        if previous is not None and previous.plan.green is not None:
            green_for = result.at - previous.at
        green_before = previous.plan.green if previous is not None else None
        self.metrics.observe_bands(result.plan.bands, green_before, green_for)
        if result.plan.rotated and result.plan.green is not None:
            self.metrics.rotations.inc()
            since = result.plan.green_since
            if since is not None:
                since += self._wall() - self._clock()
            applied = self._wall()
            generation = result.plan.generation
            self._history.append(
                {"job": result.plan.green, "since": since, "applied": applied, "plan": generation}
            )
            del self._history[:-20]
            log.info("green light -> %s", result.plan.green)
            if self._link is not None:
                self._link.applied(AppliedRotation(result.plan.green, applied, generation))
        for problem in set(result.snapshot.problems) - set(
            previous.snapshot.problems if previous else ()
        ):
            log.warning("discovery: %s", problem)
        self._last_pass = result
        if self._sampler is not None:
            self._sampler.set_snapshot(result.snapshot)
        self.metrics.forget_jobs_except(set(result.snapshot.jobs()))
        if self._link is not None:
            mode = "plan" if result.plan.generation else "local"
            self._link.update(self._reported_jobs(result), mode, "")
        self._publish()

    def _reported_jobs(self, result: PassResult) -> tuple[ReportedJob, ...]:
        """The PS jobs this agent shapes (ports in its network namespace; a PS seen in another
        namespace belongs to that namespace's host), with their telemetry."""
        snapshot, loads = result.snapshot, result.loads
        ports = snapshot.job_ports()
        recent = self._sampler.recent() if self._sampler is not None else {}
        jobs = []
        for job in sorted(shaped_jobs(snapshot)):
            tasks = [t for t in snapshot.tasks if t.job == job and t.in_agent_netns]
            iterations = recent.get(job, [])
            spreads = [it.spread for it in iterations]
            periods = [it.period for it in iterations if it.period is not None]
            jobs.append(
                ReportedJob(
                    job=job,
                    ports=ports.get(job, frozenset()),
                    processes=len(tasks),
                    connections=sum(len(t.connections) for t in tasks),
                    spread_s=statistics.median(spreads) if spreads else None,
                    period_s=statistics.median(periods) if periods else None,
                    demand=loads[job].demand if job in loads else None,
                )
            )
        return tuple(jobs)

    def _reload_config(self, reconciler: Reconciler) -> None:
        try:
            config = with_link_rate(self._load_config())
        except TensorLightsError as exc:
            log.error("config reload refused, keeping the running config: %s", exc)
            return
        if config.metrics_address != self.config.metrics_address or (
            config.status_socket != self.config.status_socket
        ):
            log.warning("metrics_address and status_socket changes take effect at restart")
        reconciler.reconfigure(config)
        if config.dscp_enabled and reconciler.marker is None:
            try:
                reconciler.marker = self._make_marker(config)
            except TensorLightsError as exc:
                log.error("DSCP marking stays off: %s", exc)
        self.config = config
        self.health.max_age_s = config.health_max_age_s
        log.info("config reloaded: policy %s, interval %.3gs", config.policy, config.interval_s)

    def _shutdown(
        self,
        reconciler: Reconciler,
        scanner: Scanner,
        metrics_server: MetricsServer,
        status_server: StatusServer,
        restore: bool,
    ) -> None:
        try:
            outcome = reconciler.stop(restore)
            if outcome:
                log.info("%s", outcome)
            elif not restore:
                log.info("leaving the shaping on %s for the next start", self.config.interface)
        except TensorLightsError as exc:
            log.error("could not restore %s: %s", self.config.interface, exc)
        finally:
            if self._link is not None:
                self._link.stop()
            if self._sampler is not None:
                self._sampler.stop()
            status_server.close()
            metrics_server.close()
            scanner.close()
            reconciler.datapath.sock.close()
            if reconciler.marker is not None:
                reconciler.marker.close()
            self.notifier.close()

    # Status ----------------------------------------------------------------------------

    def _publish(self) -> None:
        """Hand the status socket what it needs to render the status, when asked."""
        result, config, error = self._last_pass, self.config, self._last_error
        history = list(self._history)
        offset = self._wall() - self._clock()  # monotonic -> wall clock, fixed per pass
        self.board.publish(lambda: self._render(result, config, error, history, offset))

    def _render(
        self,
        result: PassResult | None,
        config: AgentConfig,
        last_error: str,
        history: list[dict[str, Any]],
        offset: float,
    ) -> dict[str, Any]:
        def wall(monotonic: float | None) -> float | None:
            return None if monotonic is None else monotonic + offset

        healthy, health_reason = self.health.check()
        document: dict[str, Any] = {
            "version": __version__,
            "interface": config.interface,
            "link_rate_bps": config.link_rate_bps,
            "policy": config.policy.value,
            "interval_s": config.interval_s,
            "standalone": config.standalone,
            "host": config.host_name,
            "controller": (
                None
                if self._link is None
                else {"address": config.controller, **dataclasses.asdict(self._link.state)}
            ),
            "healthy": healthy,
            "health": health_reason,
            "last_error": last_error,
            "rotations": {"recent": history},
        }
        if result is not None:
            plan = result.plan
            document.update(
                last_pass={
                    "at": wall(result.at),
                    "duration_s": result.duration_s,
                    "kernel_ops": result.kernel_ops,
                    "full_resync": result.full_resync,
                },
                bands=dict(plan.bands),
                dscp=(
                    {job: config.dscp_bands[band] for job, band in plan.bands.items()}
                    if config.dscp_enabled
                    else {}
                ),
                order=list(plan.order),
                mode="plan" if plan.generation else "local",
                plan_generation=plan.generation,
                discovery=snapshot_view(result.snapshot),
            )
            document["rotations"].update(
                green=plan.green,
                green_since=wall(plan.green_since),
                next=plan.order[1] if len(plan.order) > 1 else None,
                next_at=wall(plan.next_change_at),
            )
        if self._sampler is not None:
            document["telemetry"] = {
                job: [
                    {
                        "first_done": it.first_done + offset,
                        "last_done": it.last_done + offset,
                        "last_done_monotonic": it.last_done,
                        "spread_s": it.spread,
                        "period_s": it.period,
                        "push_s": it.push_seconds,
                        "connections": it.connections,
                    }
                    for it in iterations
                ]
                for job, iterations in self._sampler.recent().items()
            }
            document["telemetry_error"] = self._sampler.last_error
            if config.policy is PolicyName.PACK and self._reconciler is not None:
                loads = result.loads if result is not None else {}
                document["pack"] = self._reconciler.policy.local.pack_view(loads)
        return document


def load_config_function(
    file_reader: Callable[[], Mapping[str, Any]], overrides: Mapping[str, Any]
) -> Callable[[], AgentConfig]:
    """A loader that re-reads the file each call (SIGHUP) with the command line on top."""

    def load() -> AgentConfig:
        return build_config(file_reader(), overrides)

    return load
