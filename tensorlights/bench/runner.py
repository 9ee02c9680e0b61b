"""Runs one scenario under one policy on the emulated cluster, and measures it.

The cluster (tensorlights.testbed.cluster): a PS host `ps`, worker hosts `w1`, `w2`, `w3` and
a controller host `ctl` on a bridge. In a PS scenario the PS host's `eth0` egress is the
bottleneck: a FIFO at the link rate (tbf) without TensorLights, the agent's HTB with it, or
the baselines' `tc` trees; its workers run on `w1` and `w2`. In a collective scenario every
job has a rank on `ps`, `w1`, `w2` and `w3`, and each of those hosts' egress is shaped: a FIFO
on each, an agent on each (standalone, or all following the controller on `ctl`). Jobs start
at their arrival offsets; each is identified only by its launcher's variables. Everything a
run starts is stopped and the interfaces are left with the kernel's default qdisc afterwards.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import logging
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from tensorlights.agent.status import read_status, read_status_document, status_of
from tensorlights.bench import legacy_tc
from tensorlights.bench.cpu_use import CpuUse
from tensorlights.bench.results import JobRun, Trial
from tensorlights.bench.scenarios import (
    CONTROLLER_HOST,
    DECLARING,
    FAULT_AT_S,
    FAULT_DOWN_S,
    FAULTS,
    LEGACY,
    PS_HOST,
    PS_HOSTS,
    RANK_HOSTS,
    WORKER_HOSTS,
    JobSpec,
    Policy,
    StaticOrder,
    prototype_hosts,
)
from tensorlights.bench.traces import trace_name
from tensorlights.devca import make_pki
from tensorlights.errors import TransientError
from tensorlights.model import Mode
from tensorlights.testbed import netns
from tensorlights.testbed.cluster import Cluster
from tensorlights.testbed.daemons import controller_command, controller_section
from tensorlights.testbed.netns import Host
from tensorlights.testbed.psjob import RunningJob
from tensorlights.testbed.socket_holder import clean_env
from tensorlights.testbed.workloads import JobShape, Workload, start_up_factor, start_workload

log = logging.getLogger(__name__)

HOSTS = (*RANK_HOSTS, *PS_HOSTS[1:], CONTROLLER_HOST)
CONTROLLER_PORT = 9740
IFNAME = "eth0"
POLL_S = 0.05
STATUS_EVERY_S = 0.5
"""How often the agent's status is read for its moves of the light (it keeps its last 20)."""
STATUS_TRACE = "status.jsonl"
"""In an agent's workdir, with RunOptions.status_traces: every status read, a line each."""

Greens = list[tuple[float, int]]
"""(Unix time, job index) of every move of a green light."""


@dataclass(frozen=True)
class RunOptions:
    rate_bps: int
    interval: str = "3s"
    """The agent's rotation slot (policy rotate)."""
    original_interval_s: float = 20.0
    """The prototype's rotation period."""
    starvation_window: str = "30s"
    """The agent's starvation window (policy pack): the benchmark's jobs last 6-35 s."""
    timeout_s: float = 600.0
    fault_at_s: float = FAULT_AT_S
    """A fault run's fault, this long after the jobs' start..."""
    fault_down_s: float = FAULT_DOWN_S
    """...and how long a restarted controller stays down."""
    device: str = "cpu"
    """Where the real PyTorch jobs' workers compute (cuda: on a GPU)."""
    status_traces: Path | None = None
    """Where each agent's status reads of each run are kept (keep_status_traces); None:
    nowhere. What a policy saw and decided, read after the run: its measured loads, its
    starvation guard's lags and slack, its bands."""
    agent_settings: str = ""
    """TOML lines first in every agent's config (agent_settings.agent_settings_toml)."""


class Driver(Protocol):
    """What controls the shaped hosts' egress during a run."""

    def start(self) -> None: ...
    def job_started(self, index: int, ports: Mapping[str, int], job: str) -> None:
        """Job `index` (discovery's id `job`) started; its PS (each shard) listens on
        `ports[host]` on each of its PS hosts."""
        ...

    def tick(self, now: float) -> None: ...
    def stop(self) -> int:
        """Tear down; returns the qdisc rebuilds done (0 where that does not apply)."""
        ...

    def greens(self) -> Greens:
        """Every move of the green light seen (on the first shaped host); none without one."""
        ...

    def host_greens(self) -> dict[str, Greens]:
        """Every move of the green light seen on each shaped host that has one."""
        ...

    def daemons(self) -> list[int]:
        """The pids of the policy's own processes running now (agents, controller, the
        prototype's port feed), whose CPU the run reports apart."""
        ...


class FifoLink:
    """No TensorLights: one FIFO queue drained at the link rate."""

    def __init__(self, ns: str, rate_bps: int) -> None:
        self.ns, self.rate_bps = ns, rate_bps

    def start(self) -> None:
        netns.fifo_bottleneck(self.ns, IFNAME, f"{self.rate_bps}bit")

    def job_started(self, index: int, ports: Mapping[str, int], job: str) -> None:
        pass

    def tick(self, now: float) -> None:
        pass

    def stop(self) -> int:
        netns.run(["tc", "-n", self.ns, "qdisc", "del", "dev", IFNAME, "root"], check=False)
        return 0

    def daemons(self) -> list[int]:
        return []

    def greens(self) -> Greens:
        return []

    def host_greens(self) -> dict[str, Greens]:
        return {}


class EveryHost:
    """Several drivers driven together: one per shaped host of a collective scenario (and
    the controller first, where there is one); the light as `recorder` saw it."""

    def __init__(self, drivers: Sequence[Driver], recorder: Driver) -> None:
        self.drivers, self.recorder = list(drivers), recorder

    def start(self) -> None:
        for driver in self.drivers:
            driver.start()

    def job_started(self, index: int, ports: Mapping[str, int], job: str) -> None:
        for driver in self.drivers:
            driver.job_started(index, ports, job)

    def tick(self, now: float) -> None:
        for driver in self.drivers:
            driver.tick(now)

    def stop(self) -> int:
        """Every host restored, the controller last; the first failure raised after that."""
        stopped, failure = 0, None
        for driver in reversed(self.drivers):
            try:
                stopped += driver.stop()
            except Exception as exc:  # raised below, once every one is stopped
                failure = failure or exc
        if failure is not None:
            raise failure
        return stopped

    def greens(self) -> Greens:
        return self.recorder.greens()

    def host_greens(self) -> dict[str, Greens]:
        return {host: moves for d in self.drivers for host, moves in d.host_greens().items()}

    def daemons(self) -> list[int]:
        return [pid for driver in self.drivers for pid in driver.daemons()]


class LegacyTree:
    """The baselines built with `tc` (legacy_tc) on one host, as the prototype runs there:
    per-job classes for every job with a task on the host (`members`, the scenario's job
    indices, in arrival order) from the start; a job's port filter is added when its PS
    listens, as the prototype's launcher knew its ports, and one for every further local
    port TensorLights' discovery finds for the job (bench/port_feed.py in the host: real
    frameworks send from ephemeral ports; a ring's rank sends from its gloo pairs' ports,
    so on a rank host, `torch_ps` False, the feed is all there is). `rotate_every_s` set:
    the original TL-RR, which rebuilds the whole tree with the next job on top, its first
    rotation `phase_s` late; `order` set: that fixed order (TL-One with a chosen order);
    neither: fair (equal priorities)."""

    def __init__(
        self,
        name: str,
        host: Host,
        rate_bps: int,
        members: Sequence[int],
        rotate_every_s: float | None,
        order: StaticOrder | None = None,
        phase_s: float = 0.0,
        torch_ps: bool = True,
    ) -> None:
        self.name, self.host, self.ns = name, host, host.ns
        self.torch_ps = torch_ps
        self.rate_bps, self.rotate_every_s = rate_bps, rotate_every_s
        self.members = list(members)
        self.order = order
        self.phase_s = phase_s
        self.ports: list[list[int]] = [[] for _ in self.members]
        """Per member (its position in `members`): its ports here."""
        self.green = 0
        self.rebuilds = 0
        self.last_rebuild = 0.0
        self._greens: Greens = []
        self.index_of: dict[str, int] = {}
        self.found: queue.Queue[tuple[str, list[int]]] = queue.Queue()
        """(job, its local ports) as the port feed reports them."""
        self.feeder: subprocess.Popen[str] | None = None
        self._lock = threading.Lock()
        """Held by the loop's every step and by a launch's port filter."""
        self._stopping = threading.Event()
        self._loop = threading.Thread(target=self._run, name=f"tc-{name}", daemon=True)
        self._failure: Exception | None = None

    @property
    def fair(self) -> bool:
        return self.rotate_every_s is None and self.order is None

    def _commands(self) -> list[list[str]]:
        if self.order is not None:
            local = [self.members.index(i) for i in self.order.order if i in self.members]
            prios = legacy_tc.order_prios(tuple(local))
        elif self.rotate_every_s is None:
            prios = [0] * len(self.ports)
        else:
            prios = legacy_tc.original_prios(len(self.ports), self.green)
        return legacy_tc.htb_commands(IFNAME, self.rate_bps, self.ports, prios, fair=self.fair)

    def start(self) -> None:
        legacy_tc.rebuild(self.ns, self._commands())
        self.last_rebuild = time.monotonic() + self.phase_s
        if self.rotate_every_s is not None:
            self._greens.append((time.time(), self.members[self.green]))
        elif self.order is not None:
            first = next(i for i in self.order.order if i in self.members)
            self._greens.append((time.time(), first))
        self.feeder = subprocess.Popen(
            self.host.exec_args(
                sys.executable, "-m", "tensorlights.bench.port_feed", "--torch-ps-ranks",
                *(["0"] if self.torch_ps else []),
            ),
            stdout=subprocess.PIPE, text=True, env=clean_env(),
        )  # fmt: skip
        threading.Thread(target=self._read_feed, args=(self.feeder,), daemon=True).start()
        # Its own loop, as the prototype runs one on each host: a rebuild (a `tc` process a
        # command, up to ~1.3 s with a ring's ports under a run's load) neither waits for
        # other hosts' nor for the run's launches.
        self._loop.start()

    def _read_feed(self, feeder: subprocess.Popen[str]) -> None:
        assert feeder.stdout is not None
        for line in feeder.stdout:
            found = json.loads(line)
            self.found.put((str(found["job"]), [int(port) for port in found["ports"]]))

    def job_started(self, index: int, ports: Mapping[str, int], job: str) -> None:
        if index not in self.members:
            return
        with self._lock:
            self.index_of[job] = index
            if self.name in ports:  # its PS's (or a ring's rendezvous) port, known at launch
                self._add_port(index, ports[self.name])

    def _add_port(self, index: int, port: int) -> None:
        local = self.members.index(index)
        if port not in self.ports[local]:
            self.ports[local].append(port)
            netns.run(["tc", "-n", self.ns, *legacy_tc.port_filter(IFNAME, port, local)])

    def _run(self) -> None:
        try:
            while not self._stopping.wait(POLL_S):
                with self._lock:
                    self._step(time.monotonic())
        except Exception as exc:  # raised by tick, in the run's thread
            self._failure = exc

    def _step(self, now: float) -> None:
        if self.feeder is not None and self.feeder.poll() is not None:
            raise RuntimeError(f"the port feed exited with {self.feeder.returncode}")
        while not self.found.empty():
            job, ports = self.found.get()
            index = self.index_of.get(job)
            if index is not None:
                for port in ports:
                    self._add_port(index, port)
        if self.rotate_every_s is None or now - self.last_rebuild < self.rotate_every_s:
            return
        self.green = (self.green + 1) % len(self.ports)
        legacy_tc.rebuild(self.ns, self._commands())
        self.rebuilds += 1
        self.last_rebuild += self.rotate_every_s
        self._greens.append((time.time(), self.members[self.green]))

    def tick(self, now: float) -> None:
        if self._failure is not None:
            raise RuntimeError(f"the tc loop on {self.name} failed") from self._failure

    def stop(self) -> int:
        self._stopping.set()
        if self._loop.is_alive():
            self._loop.join()
        if self.feeder is not None and self.feeder.poll() is None:
            self.feeder.kill()
            self.feeder.wait()
        netns.run(["tc", "-n", self.ns, "qdisc", "del", "dev", IFNAME, "root"], check=False)
        if self._failure is not None:
            raise RuntimeError(f"the tc loop on {self.name} failed") from self._failure
        return self.rebuilds

    def greens(self) -> Greens:
        return list(self._greens)

    def host_greens(self) -> dict[str, Greens]:
        return {self.name: self.greens()}

    def daemons(self) -> list[int]:
        return _running(self.feeder)


def _running(proc: subprocess.Popen[Any] | None) -> list[int]:
    """`proc`'s pid while it runs (`ip netns exec` execs the command: the same pid)."""
    return [proc.pid] if proc is not None and proc.poll() is None else []


def _process_up(
    proc: subprocess.Popen[bytes], ready: Callable[[], bool], what: str, log_path: Path
) -> None:
    """Wait (30 s at most) until `ready()`; a process that exits meanwhile is an error."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the {what} exited with {proc.returncode}; see {log_path}")
        with contextlib.suppress(TransientError, OSError, json.JSONDecodeError):
            if ready():
                return
        time.sleep(0.1)
    raise RuntimeError(f"the {what} was not ready within 30 s; see {log_path}")


def _stop_process(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.terminate()  # an agent restores the kernel's default qdisc
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class ControllerOnHost:
    """The real controller (`--policy pack` or `rotate`) on the controller host, with a
    throw-away CA whose agent certificates name the shaped hosts."""

    def __init__(
        self, cluster: Cluster, workdir: Path, policy: str, agents: Sequence[str],
        options: RunOptions,
    ) -> None:  # fmt: skip
        self.host = cluster.hosts[CONTROLLER_HOST]
        self.workdir, self.policy, self.agents, self.options = workdir, policy, agents, options
        self.proc: subprocess.Popen[bytes] | None = None
        self.down = False
        """Killed on purpose (a fault): its exit is no error."""

    @property
    def address(self) -> str:
        return f"{self.host.ipv4}:{CONTROLLER_PORT}"

    def agent_config(self, host: str) -> str:
        """The [controller] section of agent `host`'s config."""
        return controller_section(self.address, self.workdir / "pki", host)

    def start(self) -> None:
        """Start it (again after `kill`: the same CA and state directory)."""
        self.down = False
        self.workdir.mkdir(parents=True, exist_ok=True)
        pki = self.workdir / "pki"
        make_pki(pki, [self.host.ipv4], list(self.agents))
        (self.workdir / "controller.toml").write_text("")
        sock = self.workdir / "tlctl.sock"
        command = controller_command(
            self.workdir / "controller.toml", self.address, sock, self.workdir / "state", pki,
            "--slot", self.options.interval, "--policy", self.policy, "--log-level", "warning",
        )  # fmt: skip
        log_path = self.workdir / "controller.log"
        with open(log_path, "ab") as log_file:
            self.proc = subprocess.Popen(
                self.host.exec_args(*command), stderr=log_file, env=clean_env()
            )
        _process_up(self.proc, sock.exists, "controller", log_path)

    def job_started(self, index: int, ports: Mapping[str, int], job: str) -> None:
        pass  # the agents report the jobs they find

    def tick(self, now: float) -> None:
        if not self.down and self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"the controller exited with {self.proc.returncode} during the run")

    def kill(self) -> None:
        """SIGKILL, as a crash: no goodbye to the agents."""
        self.down = True
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> int:
        _stop_process(self.proc)
        return 0

    def greens(self) -> Greens:
        return []

    def host_greens(self) -> dict[str, Greens]:
        return {}

    def daemons(self) -> list[int]:
        return _running(self.proc)


class AgentOnHost:
    """The real agent process on one host: standalone, or following `controller`."""

    def __init__(
        self,
        cluster: Cluster,
        workdir: Path,
        policy: str,
        options: RunOptions,
        host: str = PS_HOST,
        torch_ps: bool = True,
        controller: ControllerOnHost | None = None,
    ) -> None:
        self.name, self.host = host, cluster.hosts[host]
        self.workdir = workdir
        self.policy, self.options = policy, options
        self.torch_ps, self.controller = torch_ps, controller
        self.proc: subprocess.Popen[bytes] | None = None
        self.index_of: dict[str, int] = {}
        self._moves: dict[tuple[float, str], None] = {}
        """The agent's applied rotations seen so far: (Unix time, job id)."""
        self._status_read_at = 0.0
        self.mode: Mode | None = None
        """Whose decision its bands were at the last status read."""

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        # One tenant (root runs every job): the jobs' own variables are believed. In a PS
        # scenario torchrun's rank 0 is the PS of the real PyTorch jobs (testbed/workloads.py);
        # in a collective one every rank is (no configuration: DDP is found as it is).
        config = self.options.agent_settings
        config += f'starvation_window = "{self.options.starvation_window}"\ntrust = "any"\n'
        config += "[discovery]\ntorch_ps_ranks = [0]\n" if self.torch_ps else ""
        config += self.controller.agent_config(self.name) if self.controller else ""
        (self.workdir / "agent.toml").write_text(config)
        sock = self.workdir / "agent.sock"
        command = [
            sys.executable, "-m", "tensorlights.cli.agent", "run", "--config",
            str(self.workdir / "agent.toml"), "--interface", IFNAME, "--link-rate",
            f"{self.options.rate_bps}bit", "--policy", self.policy, "--interval",
            self.options.interval, "--status-socket", str(sock),
            "--state-dir", str(self.workdir / "state"), "--log-level", "warning",
            *([] if self.controller else ["--standalone"]),
        ]  # fmt: skip
        log_path = self.workdir / "agent.log"
        with open(log_path, "ab") as log_file:
            self.proc = subprocess.Popen(
                self.host.exec_args(*command), stderr=log_file, env=clean_env()
            )

        def ready() -> bool:
            status = read_status(sock, timeout_s=2)
            following = self.controller is None or (status is not None and status.mode is Mode.PLAN)
            return status is not None and status.healthy and following

        _process_up(self.proc, ready, f"agent on {self.name}", log_path)

    def job_started(self, index: int, ports: Mapping[str, int], job: str) -> None:
        self.index_of[job] = index  # the agent finds the PS by itself

    def tick(self, now: float) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"the agent exited with {self.proc.returncode} during the run")
        if now - self._status_read_at >= STATUS_EVERY_S:
            self._status_read_at = now
            self._read_moves()

    def _read_moves(self) -> None:
        try:
            document = read_status_document(self.workdir / "agent.sock", timeout_s=1)
        except (TransientError, OSError, json.JSONDecodeError):
            return  # the next read catches up: the agent keeps its last 20 moves
        if self.options.status_traces is not None:
            with open(self.workdir / STATUS_TRACE, "a") as trace:
                trace.write(json.dumps({"time": time.time(), "status": document}) + "\n")
        status = status_of(document)
        if status is not None:
            self.mode = status.mode
            for rotation in status.recent_rotations:
                self._moves[(rotation.applied, rotation.job)] = None

    def restart(self) -> None:
        """Stop it as systemd does (SIGTERM: it puts the kernel's default qdisc back) and
        start it again; returns once it follows the controller again."""
        self._read_moves()
        _stop_process(self.proc)
        self.start()

    def greens(self) -> Greens:
        return [
            (applied, self.index_of[job])
            for applied, job in sorted(self._moves)
            if job in self.index_of
        ]

    def host_greens(self) -> dict[str, Greens]:
        return {self.name: self.greens()}

    def daemons(self) -> list[int]:
        return _running(self.proc)

    def stop(self) -> int:
        if self.proc is not None and self.proc.poll() is None:
            self._read_moves()
        _stop_process(self.proc)
        netns.run(["tc", "-n", self.host.ns, "qdisc", "del", "dev", IFNAME, "root"], check=False)
        return 0


class Faulted(EveryHost):
    """controller-pack on every shaped host with one fault `fault_at_s` into the run (FAULTS),
    and when the agents' mode changed because of it (`events`: seconds after the start, as
    the trials record them)."""

    def __init__(
        self,
        fault: Policy,
        controller: ControllerOnHost,
        agents: Sequence[AgentOnHost],
        options: RunOptions,
    ) -> None:
        super().__init__([controller, *agents], agents[0])
        self.fault, self.controller, self.agents = fault, controller, list(agents)
        self.at_s, self.down_s = options.fault_at_s, options.fault_down_s
        self.started = 0.0
        self.events: list[tuple[float, str]] = []
        self._done: set[str] = set()
        self._modes: dict[str, Mode | None] = {}

    def start(self) -> None:
        super().start()
        self.started = time.monotonic()

    def _event(self, what: str) -> None:
        self.events.append((time.monotonic() - self.started, what))

    def tick(self, now: float) -> None:
        elapsed = now - self.started
        if "fault" not in self._done and elapsed >= self.at_s:
            self._done.add("fault")
            if self.fault is Policy.AGENT_RESTARTED:
                self._event(f"agent on {self.agents[0].name} restarting")
                self.agents[0].restart()
                self._event(f"agent on {self.agents[0].name} following again")
            else:
                self.controller.kill()
                self._event("controller killed")
        if (
            self.fault is Policy.CONTROLLER_RESTARTED
            and "fault" in self._done
            and "back" not in self._done
            and elapsed >= self.at_s + self.down_s
        ):
            self._done.add("back")
            self.controller.start()
            self._event("controller started again")
        super().tick(now)
        for agent in self.agents:  # their mode, as the status reads of super().tick saw it
            if self._modes.get(agent.name, agent.mode) != agent.mode:
                self._event(f"agent on {agent.name}: {agent.mode}")
            self._modes[agent.name] = agent.mode


def make_driver(
    policy: Policy | StaticOrder,
    cluster: Cluster,
    placements: Sequence[tuple[str, ...]],
    workdir: Path,
    options: RunOptions,
    shaped: Sequence[str] = (PS_HOST,),
    collective: bool = False,
) -> Driver:
    """What shapes the run: each `shaped` host's link (a PS scenario's PS hosts, a collective
    scenario's rank hosts) alike. `placements`: each job's PS hosts."""
    if policy in (Policy.FIFO, Policy.ALONE):
        fifos = [FifoLink(cluster.hosts[name].ns, options.rate_bps) for name in shaped]
        return fifos[0] if len(fifos) == 1 else EveryHost(fifos, fifos[0])
    if isinstance(policy, StaticOrder) or policy in LEGACY:
        order = policy if isinstance(policy, StaticOrder) else None
        rotate_every_s = options.original_interval_s if policy is Policy.TL_RR_ORIGINAL else None
        trees = [
            LegacyTree(
                name, cluster.hosts[name], options.rate_bps, members, rotate_every_s, order,
                phase_s=phase_s, torch_ps=not collective,
            )
            for name, members, phase_s in prototype_hosts(placements, shaped, collective)
        ]  # fmt: skip
        return trees[0] if len(trees) == 1 else EveryHost(trees, trees[0])
    controller = None
    agents_policy = agent_policy(policy)
    assert agents_policy is not None  # every other policy runs agents
    if policy in CONTROLLED:
        controller = ControllerOnHost(
            cluster, workdir / "controller", agents_policy, shaped, options
        )
    agents = [
        AgentOnHost(
            cluster,
            workdir / name,
            agents_policy,
            options,
            name,
            torch_ps=not collective,
            controller=controller,
        )
        for name in shaped
    ]
    if controller is not None and policy in FAULTS:
        return Faulted(policy, controller, agents, options)
    if controller is None and len(agents) == 1:
        return agents[0]
    return EveryHost([*([controller] if controller else []), *agents], agents[0])


def agent_policy(policy: Policy | StaticOrder) -> str | None:
    """The agents' --policy under `policy` (under the controller, also what each falls back
    to); None where no agent runs (FIFO, a job alone, the `tc` trees)."""
    if policy in (Policy.FIFO, Policy.ALONE) or isinstance(policy, StaticOrder) or policy in LEGACY:
        return None
    if policy in CONTROLLED:
        return CONTROLLED[policy]
    return "pack" if policy in DECLARING else policy.value


CONTROLLED = {
    Policy.CONTROLLER_PACK: "pack",
    Policy.CONTROLLER_PACK_ITERATIONS: "pack",
    Policy.CONTROLLER_ROTATE: "rotate",
    **dict.fromkeys(FAULTS, "pack"),
}
"""The controller's policies, by its --policy (the fault runs are controller-pack's)."""


def keep_status_traces(workdir: Path, to: Path, run: str, started_wall: float) -> None:
    """Each agent's status reads of a run (in its workdir, named by its host) into
    `to`/`run`-HOST.jsonl.gz, each line with at_s: seconds from the jobs' start, as the
    trial's moves of the light are timed. Gzipped: a run's reads on one host are up to ~5 MB of
    JSON (mostly telemetry's latest iterations, listed again at every read), ~a fifth of
    that gzipped (b at `--scale 3`: 5.5 MB, 1.0 MB)."""
    to.mkdir(parents=True, exist_ok=True)
    for trace in sorted(workdir.glob(f"*/{STATUS_TRACE}")):
        with gzip.open(to / trace_name(run, trace.parent.name), "wt") as kept:
            for line in trace.read_text().splitlines():
                read = json.loads(line)
                kept.write(json.dumps({"at_s": read["time"] - started_wall, **read}) + "\n")


def _tx_bytes(namespaces: Sequence[str]) -> int:
    path = f"/sys/class/net/{IFNAME}/statistics/tx_bytes"
    return sum(int(netns.run(netns.in_ns(ns, "cat", path)).stdout) for ns in namespaces)


def run_trial(
    cluster: Cluster,
    scenario: str,
    jobs: Sequence[JobSpec],
    policy: Policy | StaticOrder,
    rep: int,
    options: RunOptions,
    workdir: Path,
    profile: str = "",
) -> Trial:
    """Run `jobs` (at their arrival offsets) to completion under `policy`; measure them."""
    collective = any(spec.collective for spec in jobs)
    # A collective job's ranks 1..n on the other rank hosts, one each; a PS job's workers
    # round-robin over the worker hosts.
    worker_names = RANK_HOSTS[1:] if collective else WORKER_HOSTS
    workers = [cluster.hosts[name] for name in worker_names]
    placements = [spec.ps_hosts for spec in jobs]
    shaped = RANK_HOSTS if collective else [h for h in PS_HOSTS if any(h in p for p in placements)]
    # Link use: a PS scenario's PS hosts, a collective one's rank 0 host (as recorded before).
    measured = [cluster.hosts[name].ns for name in (shaped if not collective else [PS_HOST])]
    driver = make_driver(policy, cluster, placements, workdir, options, shaped, collective)
    running: dict[int, RunningJob] = {}
    pending = sorted(range(len(jobs)), key=lambda i: jobs[i].start_s)
    workloads = [Workload(spec.workload) for spec in jobs]
    # Real frameworks take seconds to import and meet: they are launched that long before
    # their arrival and hold their first iteration until it (start_at).
    processes = sum(
        spec.workers + spec.shards for spec, kind in zip(jobs, workloads, strict=True)
        if kind.start_up_s > 0
    )  # fmt: skip
    start_ups = [workload.start_up_s * start_up_factor(processes) for workload in workloads]
    cpu = CpuUse()
    cpu.sample(time.monotonic())
    try:
        driver.start()
        cpu.sample(time.monotonic(), driver.daemons())  # the daemons counted from here
        tx_before = _tx_bytes(measured)
        lead = max(start_ups)
        started = time.monotonic() + lead
        if isinstance(driver, Faulted):
            driver.started = started  # the fault comes that long after the jobs' start
        started_wall = time.time() + lead
        deadline = started + options.timeout_s
        while pending or any(job.ps.poll() is None for job in running.values()):
            now = time.monotonic()
            if now > deadline:
                raise RuntimeError(
                    f"{scenario}/{policy.value}: jobs still running after the timeout"
                )
            while pending and now - started >= jobs[pending[0]].start_s - start_ups[pending[0]]:
                index = pending.pop(0)
                spec = jobs[index]
                tag = f"{scenario}-{spec.name}-{policy.value}-{rep}-{cluster.run_id}"
                early = start_ups[index] > 0
                shape = JobShape(
                    spec.workers, spec.model_bytes, spec.iterations, spec.compute_s,
                    options.device, declares=policy in DECLARING,
                )  # fmt: skip
                ps_hosts = [cluster.hosts[name] for name in spec.ps_hosts]
                running[index] = start_workload(
                    workloads[index], tag, ps_hosts[0], workers, shape,
                    started + spec.start_s if early else None, ps_hosts[1:],
                )  # fmt: skip
                ports = running[index].ports or (running[index].port,)
                driver.job_started(
                    index, dict(zip(spec.ps_hosts, ports, strict=True)), running[index].job
                )
            driver.tick(now)
            cpu.tick(now, driver.daemons)
            time.sleep(POLL_S)
        cpu.sample(time.monotonic(), driver.daemons())
        runs = []
        for index, job in sorted(running.items()):
            received = job.received(timeout=60)
            summary = job.summary or {}
            if summary.get("errors") or summary.get("finished_at") is None:
                raise RuntimeError(
                    f"{scenario}/{policy.value}: job {jobs[index].name} failed: {summary}"
                )
            spreads = tuple(max(t) - min(t) for t in zip(*received, strict=True))
            runs.append(
                JobRun(
                    jobs[index].name,
                    summary["listening_at"] - started,
                    summary["finished_at"] - summary["listening_at"],
                    spreads,
                    tuple(job.shard_spreads),
                )
            )
        tx_after = _tx_bytes(measured)
    finally:
        for job in running.values():
            job.kill()
        rebuilds = driver.stop()
    first = min(r.arrival_s for r in runs)
    last = max(r.arrival_s + r.jct_s for r in runs)

    def named(moves: Greens) -> tuple[tuple[float, str], ...]:
        return tuple((at - started_wall, jobs[index].name) for at, index in moves)

    if options.status_traces is not None:
        run = f"{scenario}-{policy.value}-{rep}"
        keep_status_traces(workdir, options.status_traces, run, started_wall)
    host_greens = driver.host_greens() if len(shaped) > 1 else {}
    trial = Trial(
        scenario, policy.value, rep, options.rate_bps, tuple(runs), tx_after - tx_before,
        last - first, rebuilds, profile, named(driver.greens()),
        {host: named(moves) for host, moves in host_greens.items()}, len(measured),
        tuple(driver.events) if isinstance(driver, Faulted) else (), cpu.other_cores(),
        cpu.own_cores(), os.cpu_count(), cpu.daemon_cores(),
    )  # fmt: skip
    log.info(
        "%s %s rep %d: avg JCT %.2f s, link %.0f%%",
        scenario, policy.value, rep, trial.avg_jct_s,
        trial.utilisation * 100,
    )  # fmt: skip
    if trial.disturbed:
        log.warning(
            "%s %s rep %d: other work on this machine took %.2f cores during the run "
            "(processes not the bench's): its figures measure that load too",
            scenario, policy.value, rep, trial.other_cores,
        )  # fmt: skip
    return trial
