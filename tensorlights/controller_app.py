"""The controller daemon's composition root: config, registry, planner, sources and servers
are built here; everything runs on one asyncio loop. It sits outside `controller/` because it
wires the core to `rpc/` (whose servers adapt the core to gRPC): the core never sees rpc/.

Servers:
  agents + operators  TCP `listen`, mutual TLS (client certificates from the CA required):
                      AgentLink and Operator
  operators (local)   Unix socket `socket` (mode 0660, group `socket_group`): Operator only
  metrics             HTTP `metrics_address`: /metrics, /healthz

State is rebuilt from scratch at every start: agents re-register (their sessions are
unknown to a new controller, so their next report is NOT_FOUND and they register again) and
the sources are polled. Only the incarnation is kept (state_dir/incarnation), so that plans
of a restarted controller order after those of the previous one even if the clock stepped.

With `[ha] etcd`, this is one of several replicas: it campaigns in etcd
(controller/election.py) and only the leader plans and serves agents and tlctl; a follower
refuses them with the leader's address. Each term's incarnation comes from etcd, above every
earlier leader's. A leader that cannot renew its term in time stops leading before etcd can
elect another; a clean stop resigns, so another replica takes over at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import grp
import logging
import math
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import grpc
from prometheus_client import CollectorRegistry

from tensorlights import __version__
from tensorlights.controller.config import ControllerConfig
from tensorlights.controller.core import Controller, Source, WatchedSource
from tensorlights.controller.election import Election, Term
from tensorlights.controller.etcd import EtcdClient, EtcdError
from tensorlights.controller.kubernetes import KubernetesPods
from tensorlights.controller.metrics import ControllerMetrics
from tensorlights.controller.planner import Planner
from tensorlights.controller.registry import Registry
from tensorlights.controller.slurm import SlurmSource
from tensorlights.controller.sources import SlurmMembership, StaticJobsFile
from tensorlights.daemon.health import Health
from tensorlights.daemon.http import MetricsServer
from tensorlights.daemon.sdnotify import Notifier
from tensorlights.errors import ConfigError
from tensorlights.rpc.convert import MAX_MESSAGE_BYTES
from tensorlights.rpc.server import agent_link_service, operator_service
from tensorlights.rpc.tls import server_credentials
from tensorlights.tls_files import Role

log = logging.getLogger("tensorlights.controller")

SERVER_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
]


def next_incarnation(state_dir: Path, now_ns: int) -> int:
    """Above both the clock and the last incarnation recorded in state_dir."""
    path = state_dir / "incarnation"
    try:
        last = int(path.read_text().strip())
    except (OSError, ValueError):
        last = 0
    incarnation = max(now_ns, last + 1)
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(f"{incarnation}\n")
        tmp.replace(path)
    except OSError as exc:
        raise ConfigError(f"state_dir {state_dir}: {exc.strerror}") from exc
    return incarnation


def build_sources(config: ControllerConfig) -> list[tuple[Source, float]]:
    sources: list[tuple[Source, float]] = []
    if config.slurm:
        source = SlurmMembership(SlurmSource(config.slurm_command))
        sources.append((source, config.slurm_interval_s))
    if config.jobs_file is not None:
        sources.append((StaticJobsFile(config.jobs_file), 1.0))
    if config.kubernetes_url:
        pods = KubernetesPods(
            config.kubernetes_url,
            config.kubernetes_namespace,
            config.kubernetes_token_file,
            config.kubernetes_ca_file,
        )
        sources.append((pods, config.kubernetes_interval_s))
    return sources


def tcp_limits(config: ControllerConfig) -> list[tuple[str, int]]:
    """What bounds the TCP port against clients that connect and then stall or idle: the
    local socket (another server on the same process) stays usable however many try."""
    return [
        ("grpc.server_handshake_timeout_ms", round(config.handshake_timeout_s * 1000)),
        ("grpc.max_allowed_incoming_connections", config.max_connections),
        ("grpc.max_connection_idle_ms", round(config.idle_timeout_s * 1000)),
    ]


class ControllerApp:
    def __init__(
        self, config: ControllerConfig, registry: CollectorRegistry, notifier: Notifier
    ) -> None:
        self.config = config
        self.registry = registry
        self.notifier = notifier
        self.health = Health(max(10.0, 3 * config.report_interval_s), time.monotonic)
        self._stop: asyncio.Event | None = None
        self._term: Term | None = None
        """This replica's term while it leads (with etcd)."""

    def run(self) -> int:
        return asyncio.run(self._main())

    async def _main(self) -> int:
        config = self.config
        sources = build_sources(config)  # a bad jobs file stops us here
        metrics = ControllerMetrics(self.registry)
        incarnation = next_incarnation(config.state_dir, time.time_ns())
        election = None
        if config.etcd:
            assert config.advertise is not None
            client = EtcdClient(config.etcd)
            ttl = math.ceil(config.election_ttl_s)
            election = Election(client, config.advertise, ttl, config.etcd_prefix)
        controller = Controller(
            Registry(config.host_timeout_s),
            Planner(config.slot_s, config.lease_s, incarnation, config.policy),
            metrics,
            config.report_interval_s,
            heartbeat_interval_s=config.heartbeat_interval_s,
        )
        server = grpc.aio.server(options=[*SERVER_OPTIONS, *tcp_limits(config)])
        server.add_generic_rpc_handlers(
            (
                agent_link_service(controller, check_identity=True),
                operator_service(controller, Role.OPERATOR),
            )
        )
        host, port = config.listen
        target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        credentials = server_credentials(config.tls)
        bound = _bind(lambda: server.add_secure_port(target, credentials), target)
        local = self._local_server(controller)
        http = MetricsServer(config.metrics_address, self.registry, self.health)
        await server.start()
        if local is not None:
            await local.start()
            self._secure_socket()
        http.start()
        self._stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self._stop.set)
        tasks = [asyncio.create_task(controller.replan_loop(), name="replan")]
        tasks += [
            asyncio.create_task(controller.source_loop(source, interval), name=source.name)
            for source, interval in sources
        ]
        tasks.append(asyncio.create_task(self._heartbeat(), name="heartbeat"))
        if election is not None:
            controller.follow(None)  # until it wins a term
            tasks.append(asyncio.create_task(self._leadership(controller, election), name="lead"))
        log.info(
            "tensorlights-controller %s: agents on %s:%d (mTLS)%s, slot %.3gs, lease %.3gs, "
            "sources: %s",
            __version__,
            host,
            bound,
            f", tlctl on {config.socket}" if config.socket else "",
            config.slot_s,
            config.lease_s,
            ", ".join(s.name for s, _ in sources) or "agents only",
        )
        self.notifier.send(READY="1", STATUS=f"serving on {host}:{bound}")
        try:
            await self._stop.wait()
        finally:
            self.notifier.send(STOPPING="1")
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if election is not None and self._term is not None:
                try:  # another replica can take over at once, not after the TTL
                    await asyncio.wait_for(asyncio.to_thread(election.resign, self._term), 2.0)
                except (EtcdError, TimeoutError) as exc:
                    log.warning("could not resign the leadership (it expires by itself): %s", exc)
            for source, _ in sources:
                if isinstance(source, WatchedSource):
                    await asyncio.to_thread(source.close)
            await server.stop(grace=1.0)
            if local is not None:
                await local.stop(grace=1.0)
                with contextlib.suppress(FileNotFoundError):
                    assert config.socket is not None
                    config.socket.unlink()
            http.close()
            self.notifier.close()
        return 0

    async def _leadership(self, controller: Controller, election: Election) -> None:
        """Campaign until elected, hold the term while it can be renewed in time, and again
        (see controller/election.py)."""
        while True:
            self._term = await self._campaign(controller, election)
            config = self.config
            planner = Planner(config.slot_s, config.lease_s, self._term.incarnation, config.policy)
            controller.lead(planner, election.address)
            log.info("leading the controllers (incarnation %d)", self._term.incarnation)
            why = await self._hold(election)
            log.warning("stopped leading (incarnation %d): %s", self._term.incarnation, why)
            controller.follow(None)
            self._term = None

    async def _campaign(self, controller: Controller, election: Election) -> Term:
        """Follow whoever leads until this replica wins a term."""
        failing = False
        while True:
            try:
                term = await asyncio.to_thread(election.campaign)
            except EtcdError as exc:
                if not failing:
                    log.warning("cannot campaign for the leadership: %s", exc)
                failing, term = True, None
            else:
                failing = False
            if term is not None:
                return term
            controller.follow(election.known_leader)
            await asyncio.sleep(election.renew_every_s)

    async def _hold(self, election: Election) -> str:
        """Renew the term until it cannot be renewed before it ends; why it ended."""
        failing = False
        while True:
            term = self._term
            assert term is not None
            wait_s = min(election.renew_every_s, election.step_down_at(term) - time.monotonic())
            await asyncio.sleep(max(0.0, wait_s))
            budget_s = max(0.01, election.step_down_at(term) - time.monotonic())
            try:
                renewed = await asyncio.wait_for(asyncio.to_thread(election.renew, term), budget_s)
            except (EtcdError, TimeoutError) as exc:
                if not failing:
                    log.warning("cannot renew the leadership: %s", exc)
                failing, renewed = True, term
            else:
                failing = False
            if renewed is None:
                return "its lease is gone"
            if time.monotonic() >= election.step_down_at(renewed):
                return "etcd did not answer in time"
            self._term = renewed

    def _local_server(self, controller: Controller) -> grpc.aio.Server | None:
        path = self.config.socket
        if path is None:
            return None
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # a leftover from a crash: nothing listens there (we hold the port)
        local = grpc.aio.server(options=SERVER_OPTIONS)
        local.add_generic_rpc_handlers((operator_service(controller, role=None),))
        old = os.umask(0o177)  # the socket is born owner-only, widened to the group below
        try:
            _bind(lambda: local.add_insecure_port(f"unix:{path}"), str(path))
        finally:
            os.umask(old)
        return local

    def _secure_socket(self) -> None:
        path, group = self.config.socket, self.config.socket_group
        assert path is not None
        if group is not None:
            try:
                gid = grp.getgrnam(group).gr_gid
            except KeyError:
                raise ConfigError(f"socket_group {group!r} does not exist") from None
            os.chown(path, -1, gid)
        os.chmod(path, 0o660 if group is not None else 0o600)

    async def _heartbeat(self) -> None:
        """The loop is alive: /healthz and the systemd watchdog."""
        while True:
            self.health.success()
            self.notifier.send(WATCHDOG="1")
            await asyncio.sleep(1.0)

    def request_stop(self) -> None:
        if self._stop is not None:
            self._stop.set()


def _bind(add: Callable[[], int], where: str) -> int:
    try:
        port = int(add())
    except RuntimeError as exc:
        raise ConfigError(f"cannot listen on {where}: {exc}") from exc
    if port == 0:
        raise ConfigError(f"cannot listen on {where} (in use, or not an address of this host)")
    return port
