"""The agent's composition root: config, clocks, registry and servers are built here and
passed down; the reconcile loop runs on the main thread.

Lifecycle:
  start   config validated (exit 2 on error, nothing programmed) -> interface checked ->
          servers bound -> first pass -> READY=1
  loop    one pass every scan_interval, woken early when the light is due to move, by process
          events, or when a poll_interval check finds discovery news; WATCHDOG=1 after every
          pass that completed (the loop is alive), /healthz from successful passes
  errors  before the first good pass: a PermanentError is fatal (exit 1; systemd restarts
          the unit). Transient errors, and once a pass has succeeded every error: back off
          (0.5 s doubling to 10 s), resync, /healthz 503 with the reason (errors.py)
  SIGHUP  reload the config file: validated first; on error the old config stays
  SIGTERM restore the interface (on_stop = restore, the default) or leave the shaping for the
          next start to adopt (on_stop = leave); exit 0
"""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
import threading
import time
from collections.abc import Callable
from types import FrameType

from prometheus_client import CollectorRegistry

from tensorlights import __version__
from tensorlights.agent.config import AgentConfig, OnStop, marking, with_link_rate
from tensorlights.agent.link import ControllerBinding
from tensorlights.agent.loop import AgentLoop, Observers
from tensorlights.agent.metrics import AgentMetrics, KernelCounters
from tensorlights.agent.reconcile import Reconciler
from tensorlights.agent.status_server import StatusBoard, StatusServer
from tensorlights.daemon.health import Health
from tensorlights.daemon.http import MetricsServer
from tensorlights.daemon.sdnotify import Notifier
from tensorlights.datapath import open_datapath
from tensorlights.datapath.dataplane import Dataplane
from tensorlights.datapath.watch import KernelWatcher
from tensorlights.discovery.proc_events import EventsUnavailable, ProcessWatcher, ProcEvents
from tensorlights.discovery.scanner import Scanner
from tensorlights.errors import PermanentError, TensorLightsError
from tensorlights.telemetry.sampler import TelemetrySampler

log = logging.getLogger("tensorlights.agent")


def _ifindex(interface: str) -> int | None:
    try:
        return socket.if_nametoindex(interface)
    except OSError:
        return None  # gone: the loop's passes notice and report it


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
        self._stop = threading.Event()
        self._reload = threading.Event()
        self._wake = threading.Event()

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
        with contextlib.ExitStack() as setup:  # a refusal leaves nothing behind
            board = StatusBoard()
            # Bound first: a taken address or socket refuses before the kernel is touched.
            metrics_server = MetricsServer(config.metrics_address, self.registry, self.health)
            setup.callback(metrics_server.close)
            status_server = StatusServer(config.status_socket, board)
            setup.callback(status_server.close)
            tc = open_datapath(
                "htb", config.state_dir, take_over_foreign=config.take_over_foreign_qdisc
            )
            setup.callback(tc.sock.close)
            tc.link(config.interface)  # InterfaceNotFoundError now, before anything else
            dataplane = Dataplane(tc, marking=marking(config))
            setup.callback(dataplane.set_marking, None)  # the table its probe made
            dataplane.set_pods(config.pod_shaping)
            setup.callback(dataplane.set_pods, False)
            self.metrics.dscp_enabled.set(dataplane.marking)
            events, polling_reason = self._process_events(config)
            if events is not None:
                setup.callback(events.stop)
            scanner = Scanner(config.rules, events=events, polling_reason=polling_reason)
            setup.callback(scanner.close)
            sampler = self._sampler(config)
            if sampler is not None:
                reconciler = Reconciler(
                    config, scanner, dataplane, self._clock,
                    lambda: sampler.loads(self.config.link_rate_bps or 1), sampler.started,
                )  # fmt: skip
            else:
                reconciler = Reconciler(config, scanner, dataplane, self._clock)
            link = None
            if not config.standalone:
                link = ControllerBinding(
                    config,
                    time.time_ns(),  # the incarnation: a later start's registrations order after
                    self._clock,
                    self._wall,
                    self._wake.set,
                    self.metrics.controller_connected.set,
                )
            observers = Observers(self.metrics, self.health, self.notifier, board, link, sampler)
            loop = AgentLoop(config, reconciler, observers, self._clock, self._wall)

            def kernel_changed(reason: str) -> None:  # on the watcher's thread
                loop.request_resync(reason)
                self._wake.set()

            watcher = KernelWatcher(
                lambda: _ifindex(self.config.interface),
                tc.major,
                kernel_changed,
                marks=dataplane.marking,
            )
            setup.callback(watcher.close)
            setup.pop_all()  # started: the shutdown below closes them
        self.registry.register(
            KernelCounters(
                lambda: dataplane.class_counters(self.config.interface),
                sampler.sent_counters if sampler is not None else dict,
            )
        )
        self.metrics.controller_connected.set(0)
        self.metrics.controller_configured.set(0 if config.standalone else 1)
        for part in (metrics_server, status_server, sampler, link, watcher, events):
            if part is not None:
                part.start()
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
            loop.run(self._stop, self._wake, lambda: self._reload_if_asked(loop, dataplane))
        except PermanentError as exc:
            log.error("stopping: %s", exc)
            self.notifier.send(STATUS=f"failed: {exc}")
            code = 1
        else:
            self.notifier.send(STOPPING="1")
        try:
            self._stop_shaping(reconciler, code == 0 and self.config.on_stop is OnStop.RESTORE)
        finally:
            if link is not None:
                link.stop()
            if sampler is not None:
                sampler.stop()
            watcher.close()
            if events is not None:
                events.stop()
            for server in (status_server, metrics_server, scanner, dataplane, self.notifier):
                server.close()
        return code

    def _stop_shaping(self, reconciler: Reconciler, restore: bool) -> None:
        try:
            outcome = reconciler.stop(restore)
            if outcome:
                log.info("%s", outcome)
            elif not restore:
                log.info("leaving the shaping on %s for the next start", self.config.interface)
        except TensorLightsError as exc:
            log.error("could not restore %s: %s", self.config.interface, exc)

    def _process_events(self, config: AgentConfig) -> tuple[ProcessWatcher | None, str]:
        """The kernel's process events, or None and why (discovery lists /proc; the status
        says why)."""
        if not config.process_events:
            return None, "process_events = false"
        try:
            events = ProcEvents.open()
        except EventsUnavailable as exc:
            log.warning("process events unavailable, polling /proc instead: %s", exc)
            return None, f"process events unavailable: {exc}"
        return ProcessWatcher(events, self._wake.set, config.poll_interval_s), ""

    def _sampler(self, config: AgentConfig) -> TelemetrySampler | None:
        if not config.telemetry_enabled:
            return None
        return TelemetrySampler(
            config.telemetry_sample_interval_s,
            config.telemetry_min_push_bytes,
            self.metrics.observe_iteration,
            self._clock,
        )

    def _reload_if_asked(self, loop: AgentLoop, dataplane: Dataplane) -> None:
        """SIGHUP: the config file again, validated first; on error the old config stays."""
        if not self._reload.is_set():
            return
        self._reload.clear()
        try:
            config = with_link_rate(self._load_config())
        except TensorLightsError as exc:
            log.error("config reload refused, keeping the running config: %s", exc)
            return
        if config.metrics_address != self.config.metrics_address or (
            config.status_socket != self.config.status_socket
        ):
            log.warning("metrics_address and status_socket changes take effect at restart")
        loop.reconciler.reconfigure(config)
        try:
            dataplane.set_marking(marking(config))
        except TensorLightsError as exc:
            log.error("DSCP marking stays off: %s", exc)
        self.metrics.dscp_enabled.set(dataplane.marking)
        try:
            dataplane.set_pods(config.pod_shaping)
        except TensorLightsError as exc:
            log.error("pods' traffic stays unshaped: %s", exc)
        self.config = loop.config = config
        self.health.max_age_s = config.health_max_age_s
        log.info("config reloaded: policy %s, interval %.3gs", config.policy, config.interval_s)
