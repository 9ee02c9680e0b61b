"""Discovery against real processes holding real sockets (loopback and namespaces)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from tensorlights.discovery.proc_events import ProcessWatcher, ProcEvents
from tensorlights.discovery.procfs import (
    ProcessGone,
    ProcFs,
    ProcKey,
    missing_read_capabilities,
)
from tensorlights.discovery.rules import DiscoveryRules, OperatorRule, ProcessFacts
from tensorlights.discovery.scanner import YOUNG_PS_S
from tensorlights.discovery.trust import TRUST_ANY
from tensorlights.model import DiscoverySnapshot, PsTask
from tensorlights.testbed import netns
from tensorlights.testbed.socket_holder import Holder, start_holder

from .holders import holders, in_cgroup, new_scanner, own_cgroup, scan_until, tf_config


@pytest.fixture(params=["polling", "events"])
def events(request: pytest.FixtureRequest) -> Iterator[ProcessWatcher | None]:
    """Discovery as without process events (listing /proc) and as with them (the agent's
    default): tests taking this fixture run both ways."""
    if request.param == "polling":
        yield None
        return
    watcher = ProcessWatcher(ProcEvents.open(), lambda: None)
    watcher.start()
    try:
        yield watcher
    finally:
        watcher.stop()


def task_of(snapshot: DiscoverySnapshot, pid: int) -> PsTask | None:
    return next((task for task in snapshot.tasks if task.pid == pid), None)


def has_ports(holder: Holder):  # type: ignore[no-untyped-def]
    def done(snapshot: DiscoverySnapshot) -> bool:
        task = task_of(snapshot, holder.pid)
        return task is not None and holder.ports <= task.local_ports

    return done


def test_tf_config_ps_found_with_its_sockets_and_iterations_and_workers_are_members() -> None:
    with holders() as start, new_scanner() as scanner:
        declared = {"TENSORLIGHTS_ITERATIONS": "500"}
        ps = start({"TF_CONFIG": tf_config("ps", "0"), **declared}, "--connections", "3")
        worker = start({"TF_CONFIG": tf_config("worker", 1)}, "--connections", "1")
        snapshot = scan_until(scanner, has_ports(ps))
        task = task_of(snapshot, ps.pid)
        assert task is not None
        assert task.source == "tf_config"
        assert snapshot.declared_iterations == {task.job: 500}
        assert task.listen_ports == {ps.report["listen_port"]}
        assert task.local_ports == ps.ports
        # 3 accepted connections on the listen port, 3 outgoing ones from ephemeral ports.
        assert len(task.connections) == 6
        assert set(task.peers) == {"w0-a:2222", "w1-a:2222"}
        assert task_of(snapshot, worker.pid) is None
        roles = {(job, role): n for job, role, n in snapshot.members}
        assert roles[(task.job, "ps")] == 1 and roles[(task.job, "worker")] == 1
        assert snapshot.job_ports() == {task.job: frozenset(ps.ports)}


def test_each_launcher_environment_identifies_its_ps() -> None:
    rules = DiscoveryRules(
        torch_ps_ranks=frozenset({0}), slurm_ps_procids=frozenset({0}), trust=TRUST_ANY
    )
    cases = {
        "dmlc/10.0.0.9:9000": {
            "DMLC_ROLE": "server",
            "DMLC_PS_ROOT_URI": "10.0.0.9",
            "DMLC_PS_ROOT_PORT": "9000",
        },
        "torch/run-42": {"TORCHELASTIC_RUN_ID": "run-42", "ROLE_NAME": "ps", "RANK": "3"},
        "torch/10.0.0.7:29500": {"MASTER_ADDR": "10.0.0.7", "MASTER_PORT": "29500", "RANK": "0"},
        "slurm/4242": {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0"},
        "explicit-job": {"TENSORLIGHTS_JOB": "explicit-job", "TENSORLIGHTS_ROLE": "ps"},
    }
    not_ps = [
        {"DMLC_ROLE": "worker", "DMLC_PS_ROOT_URI": "10.0.0.9", "DMLC_PS_ROOT_PORT": "9000"},
        {"TORCHELASTIC_RUN_ID": "run-42", "ROLE_NAME": "trainer", "RANK": "1"},
        {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1"},
        {},
    ]
    with holders() as start, new_scanner(rules) as scanner:
        ps = {job: start(env) for job, env in cases.items()}
        others = [start(env) for env in not_ps]
        snapshot = scan_until(scanner, lambda s: all(has_ports(h)(s) for h in ps.values()))
        for job, holder in ps.items():
            task = task_of(snapshot, holder.pid)
            assert task is not None and task.job == job, job
            assert task.local_ports == holder.ports
        for holder in others:
            assert task_of(snapshot, holder.pid) is None


def test_operator_rule_names_the_job_from_the_command_line() -> None:
    rule = OperatorRule(
        name="legacy",
        role="ps",
        job="legacy-${name}",
        cmdline_regex=r"--connections (?P<name>\d+)",
    )
    rules = DiscoveryRules(operator_rules=(rule,), trust=TRUST_ANY)
    with holders() as start, new_scanner(rules) as scanner:
        holder = start({}, "--connections", "2")
        snapshot = scan_until(scanner, has_ports(holder))
        task = task_of(snapshot, holder.pid)
        assert task is not None
        assert (task.job, task.source) == ("legacy-2", "rule:legacy")


def test_sockets_of_a_child_process_belong_to_the_ps_job(events: ProcessWatcher | None) -> None:
    rule = OperatorRule(name="by-env", role="ps", job="parent-job", env={"PS_MARK": "1"})
    rules = DiscoveryRules(operator_rules=(rule,), trust=TRUST_ANY)
    with holders() as start, new_scanner(rules, events=events) as scanner:
        # The child execs without PS_MARK: only its parentage tells it is part of the PS.
        holder = start({"PS_MARK": "1"}, "--child", "--child-unset", "PS_MARK")
        child_ports = {holder.report["child_listen_port"]}
        child = holder.report["child_pid"]

        def found(snapshot: DiscoverySnapshot) -> bool:
            task = task_of(snapshot, child)
            return task is not None and child_ports <= task.listen_ports

        snapshot = scan_until(scanner, found)
        task = task_of(snapshot, child)
        assert task is not None and task.job == "parent-job"
        assert task.source == f"parent:{holder.pid}"
        assert snapshot.job_ports()["parent-job"] >= child_ports | holder.ports


def test_ps_that_execs_after_a_launcher_fork_is_found_quickly(
    events: ProcessWatcher | None,
) -> None:
    script = (
        "sleep 0.3; exec env TENSORLIGHTS_JOB=late TENSORLIGHTS_ROLE=ps "
        f"{sys.executable} -m tensorlights.testbed.socket_holder"
    )
    with new_scanner(events=events) as scanner:
        scanner.scan()
        holder = start_holder({}, prefix=["sh", "-c", script])
        try:
            snapshot = scan_until(scanner, has_ports(holder), deadline_s=5)
            task = task_of(snapshot, holder.pid)
            assert task is not None and task.job == "late"
        finally:
            holder.stop()


def test_new_socket_of_a_known_ps_is_found(events: ProcessWatcher | None) -> None:
    """Descriptor caching must not hide a socket opened after the PS was first seen."""
    with holders() as start, new_scanner(events=events) as scanner:
        holder = start({"TENSORLIGHTS_JOB": "j", "TENSORLIGHTS_ROLE": "ps"}, "--connections", "2")
        scan_until(scanner, has_ports(holder))
        for _ in range(3):
            port = holder.listen_more()

            def found(snapshot: DiscoverySnapshot, port: int = port) -> bool:
                task = task_of(snapshot, holder.pid)
                return task is not None and port in task.listen_ports

            assert found(scan_until(scanner, found, deadline_s=2)), port


def test_an_older_ps_that_opens_a_socket_is_news_within_a_poll() -> None:
    """A worker that connects to its PS long after the PS started (TensorFlow's do at their
    first step) is news at the next poll, not at the next scan up to a second later, when
    telemetry has missed its first pushes: every PS's descriptor count is watched, not only
    a young one's."""
    offset = [0.0]
    # Subscribed but pumped by no one: the only news can come from the descriptors.
    watching = ProcessWatcher(ProcEvents.open(), lambda: None)
    try:
        with (
            holders() as start,
            new_scanner(events=watching, clock=lambda: time.monotonic() + offset[0]) as scanner,
        ):
            holder = start({"TENSORLIGHTS_JOB": "old", "TENSORLIGHTS_ROLE": "ps"})
            scan_until(scanner, has_ports(holder))
            offset[0] = YOUNG_PS_S + 1  # the PS is no longer young
            scanner.scan()
            assert scanner.polls()
            assert not scanner.changed()
            port = holder.listen_more()
            assert scanner.changed()
            task = task_of(scanner.scan(), holder.pid)
            assert task is not None and port in task.listen_ports
    finally:
        watching.stop()


def test_malformed_launcher_environment_is_reported_not_ignored() -> None:
    with holders() as start, new_scanner() as scanner:
        holder = start({"TF_CONFIG": '{"cluster": {"ps": ["a:1"]}, "task": {"type": "ps"'})

        def reported(snapshot: DiscoverySnapshot) -> bool:
            return any(f"pid {holder.pid} " in line for line in snapshot.problems)

        snapshot = scan_until(scanner, reported)
        assert task_of(snapshot, holder.pid) is None
        line = next(line for line in snapshot.problems if f"pid {holder.pid} " in line)
        assert "TF_CONFIG is malformed" in line


def test_port_taken_over_by_another_process_is_never_the_old_jobs(
    events: ProcessWatcher | None,
) -> None:
    with holders() as start, new_scanner(events=events) as scanner:
        ps = start({"TENSORLIGHTS_JOB": "old", "TENSORLIGHTS_ROLE": "ps"})
        port = ps.report["listen_port"]
        scan_until(scanner, has_ports(ps))
        ps.stop()
        # No scan in between: the scanner still believes `old` owns `port`.
        thief = start({}, "--port", str(port), "--connections", "2")
        assert thief.report["listen_port"] == port
        snapshot = scanner.scan()
        assert snapshot.tasks == ()
        assert snapshot.job_ports() == {}


@pytest.mark.root
def test_reused_pid_is_a_different_process(events: ProcessWatcher | None) -> None:
    """Force the kernel to hand the PS's PID to a plain process (ns_last_pid) that then binds
    the PS's port: nothing may be attributed to the old job."""
    with new_scanner(events=events) as scanner:
        ps = start_holder({"TENSORLIGHTS_JOB": "old", "TENSORLIGHTS_ROLE": "ps"})
        try:
            scan_until(scanner, has_ports(ps))
        finally:
            ps.stop()
        reused: Holder | None = None
        for _ in range(50):
            Path("/proc/sys/kernel/ns_last_pid").write_text(str(ps.pid - 1))
            candidate = start_holder({}, "--port", str(ps.report["listen_port"]))
            if candidate.pid == ps.pid:
                reused = candidate
                break
            candidate.stop()
        if reused is None:
            pytest.skip("could not get the PID reused (another process took it each time)")
        try:
            snapshot = scanner.scan()
            assert snapshot.tasks == ()
            assert all(job != "old" for job, _, _ in snapshot.members)
        finally:
            reused.stop()


class _KillingProcFs(ProcFs):
    """The real /proc, but the victim is killed (for real) right before one read of it."""

    def __init__(self, victim: Holder, at: str) -> None:
        super().__init__()
        self.victim, self.at = victim, at

    def _kill_if(self, stage: str, pid: int) -> None:
        if stage == self.at and pid == self.victim.pid and self.victim.proc.poll() is None:
            self.victim.proc.kill()
            self.victim.proc.wait()

    def facts(self, key: ProcKey) -> ProcessFacts:
        self._kill_if("facts", key.pid)
        return super().facts(key)

    def fd_count(self, pid: int) -> int:
        self._kill_if("fds", pid)
        return super().fd_count(pid)

    def fd_sockets(self, pid: int, known: Mapping[str, int] | None = None) -> dict[str, int]:
        self._kill_if("fds", pid)
        return super().fd_sockets(pid, known)


@pytest.mark.parametrize("stage", ["facts", "fds"])
def test_process_exiting_mid_scan_is_dropped_and_others_are_intact(stage: str) -> None:
    env = {"TENSORLIGHTS_JOB": "j", "TENSORLIGHTS_ROLE": "ps"}
    with holders() as start:
        survivor = start(env, "--connections", "2")
        victim = start(env, "--connections", "2")
        procfs = _KillingProcFs(victim, "never")
        with new_scanner(procfs=procfs) as scanner:
            if stage == "fds":
                scan_until(scanner, lambda s: has_ports(victim)(s) and has_ports(survivor)(s))
            procfs.at = stage
            snapshot = scanner.scan()
            assert victim.proc.poll() is not None
            assert task_of(snapshot, victim.pid) is None
            survivor_task = task_of(snapshot, survivor.pid)
            if stage == "fds":  # known before: still known with all its sockets
                assert survivor_task is not None and survivor_task.local_ports == survivor.ports
            snapshot = scan_until(scanner, has_ports(survivor))
            assert task_of(snapshot, victim.pid) is None


def test_procfs_reports_a_vanished_process_as_gone() -> None:
    proc = subprocess.Popen(["sleep", "30"])
    procfs = ProcFs()
    key = procfs.stat(proc.pid).key
    proc.kill()
    proc.wait()
    for read in (procfs.stat, procfs.socket_inodes, procfs.cmdline_bytes):
        with pytest.raises(ProcessGone):
            read(proc.pid)
    with pytest.raises(ProcessGone):
        procfs.facts(key)


def test_fifty_processes_with_forty_sockets_each() -> None:
    env = {"TENSORLIGHTS_ROLE": "ps"}
    with holders() as start, new_scanner() as scanner:
        # 1 listener + 19 connections x 2 ends (+ stdio pipes, not sockets) = 39 sockets.
        fleet = [
            start({**env, "TENSORLIGHTS_JOB": f"job-{i % 10}"}, "--connections", "19")
            for i in range(50)
        ]
        snapshot = scan_until(scanner, lambda s: all(has_ports(h)(s) for h in fleet), 30)
        for i, holder in enumerate(fleet):
            task = task_of(snapshot, holder.pid)
            assert task is not None and task.job == f"job-{i % 10}"
            assert len(task.connections) == 38 and task.local_ports == holder.ports
        # Ephemeral ports of connections to different listeners may coincide across jobs
        # (the kernel only keeps 4-tuples unique): those ports go to no job.
        expected: dict[str, set[int]] = {}
        for i, holder in enumerate(fleet):
            expected.setdefault(f"job-{i % 10}", set()).update(holder.ports)
        contested = snapshot.contested_ports()
        for job, ports in expected.items():
            assert snapshot.job_ports()[job] == ports - contested
        owners: dict[int, set[str]] = {}
        for job, ports in expected.items():
            for port in ports:
                owners.setdefault(port, set()).add(job)
        assert contested == {port for port, jobs in owners.items() if len(jobs) > 1}


@pytest.mark.root
def test_ps_in_another_network_namespace_is_followed(pair: netns.HostPair) -> None:
    env = {"TENSORLIGHTS_JOB": "contained", "TENSORLIGHTS_ROLE": "ps"}
    with holders() as start, new_scanner() as scanner:
        worker = start({}, "--host", pair.b.ipv4, prefix=pair.b.exec_args())
        worker_address = f"{pair.b.ipv4}:{worker.report['listen_port']}"
        server = start(
            env, "--host", pair.a.ipv4, "--connect", worker_address, prefix=pair.a.exec_args()
        )
        snapshot = scan_until(scanner, has_ports(server))
        task = task_of(snapshot, server.pid)
        assert task is not None
        assert not task.in_agent_netns and task.netns != scanner.agent_netns
        assert task.listen_ports == {server.report["listen_port"]}
        peers = {(conn.peer_addr, conn.peer_port) for conn in task.connections}
        assert (pair.b.ipv4, worker.report["listen_port"]) in peers
        assert snapshot.job_ports() == {}  # not on the agent's own interfaces


def test_ranks_of_collective_jobs_are_found_with_their_sockets_and_no_configuration() -> None:
    torchrun = {"TORCHELASTIC_RUN_ID": "ddp-7", "RANK": "1", "LOCAL_RANK": "0", "WORLD_SIZE": "4"}
    cases = {
        "torch/ddp-7": torchrun | {"MASTER_ADDR": "10.0.0.7", "MASTER_PORT": "29500"},
        "horovod/10.0.0.8:4321": {"HOROVOD_RANK": "2", "HOROVOD_SIZE": "4"}
        | {"HOROVOD_GLOO_RENDEZVOUS_ADDR": "10.0.0.8", "HOROVOD_GLOO_RENDEZVOUS_PORT": "4321"},
        "mpi/prterun-n1-99@1": {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4"}
        | {"PMIX_NAMESPACE": "prterun-n1-99@1"},
    }
    with holders() as start, new_scanner() as scanner:
        # A rank listens for its peers and connects to others: both kinds of port are its job's.
        ranks = {job: start(env, "--connections", "2") for job, env in cases.items()}
        snapshot = scan_until(scanner, lambda s: all(has_ports(h)(s) for h in ranks.values()))
        for job, holder in ranks.items():
            task = task_of(snapshot, holder.pid)
            assert task is not None and (task.job, task.kind) == (job, "collective"), job
            assert task.rdma is None and task.local_ports == holder.ports
        kinds, ports = snapshot.job_kinds(), snapshot.job_ports()
        assert {job: kinds[job] for job in cases} == dict.fromkeys(cases, "collective")
        assert {job: ports[job] for job in cases} == {
            j: frozenset(h.ports) for j, h in ranks.items()
        }
        members = {(job, role) for job, role, _ in snapshot.members if job in cases}
        assert members == {(job, "rank") for job in cases}


@pytest.mark.root
def test_a_job_sending_over_rdma_is_listed_as_not_shapeable_and_gets_no_ports() -> None:
    """NCCL over InfiniBand bypasses the qdisc: told by the environment, or for sure by an
    open /dev/infiniband device (here a file on a tmpfs mounted over /dev in the rank's own
    mount namespace: this machine has no RDMA NIC)."""
    device = (
        "mount -t tmpfs tl-test /dev && mkdir /dev/infiniband && "
        'touch /dev/infiniband/uverbs0 && exec "$0" "$@"'
    )
    prefix = ["unshare", "--mount", "--propagation", "private", "sh", "-c", device]
    torch = {"MASTER_ADDR": "10.0.0.9", "MASTER_PORT": "29500", "RANK": "0"}
    with holders() as start, new_scanner() as scanner:
        by_env = start(torch | {"TORCHELASTIC_RUN_ID": "ib-env", "NCCL_IB_HCA": "mlx5_0"})
        by_device = start(
            torch | {"TORCHELASTIC_RUN_ID": "ib-dev"},
            "--open",
            "/dev/infiniband/uverbs0",
            prefix=prefix,
        )
        plain = start(torch | {"TORCHELASTIC_RUN_ID": "tcp"})
        snapshot = scan_until(scanner, lambda s: len(s.unshapeable) == 2 and has_ports(plain)(s))
        assert set(snapshot.unshapeable) == {"torch/ib-env", "torch/ib-dev"}
        assert "torch/ib-env" not in snapshot.job_ports()
        assert "NCCL_IB_HCA" in snapshot.unshapeable["torch/ib-env"]
        assert f"pid {by_device.pid}" in snapshot.unshapeable["torch/ib-dev"]
        assert "/dev/infiniband" in snapshot.unshapeable["torch/ib-dev"]
        assert snapshot.job_ports()["torch/tcp"] == frozenset(plain.ports)
        assert task_of(snapshot, by_env.pid) is not None  # found, and said why not shaped


@pytest.fixture
def slurm_cgroup() -> Iterator[Path]:
    with own_cgroup("job_9137/step_0/user/task_0") as leaf:
        yield leaf


@pytest.mark.root
def test_slurm_job_from_the_cgroup_when_the_environment_lacks_it(slurm_cgroup: Path) -> None:
    rules = DiscoveryRules()
    with holders() as start, new_scanner(rules) as scanner:
        # The role comes from the framework; the job id only from the cgroup path.
        holder = start({"TF_CONFIG": tf_config("ps", 0)}, prefix=in_cgroup(slurm_cgroup))
        snapshot = scan_until(scanner, has_ports(holder))
        task = task_of(snapshot, holder.pid)
        assert task is not None and task.job == "slurm/9137"


def test_discover_command_uses_the_config_files_rules(tmp_path: Path) -> None:
    config = tmp_path / "agent.toml"
    config.write_text(
        '[[discovery.rule]]\nname = "mine"\nrole = "ps"\njob = "from-rule"\n'
        'env = { MARK = "yes" }\n'
    )
    with holders() as start:
        holder = start({"MARK": "yes"})
        command = [sys.executable, "-m", "tensorlights.cli.agent", "discover", "--json"]
        command += ["--trust", "any"]
        out = subprocess.run(
            [*command, "--config", str(config)], capture_output=True, text=True, check=True
        ).stdout
        tasks = [t for t in json.loads(out)["tasks"] if t["pid"] == holder.pid]
        assert [t["job"] for t in tasks] == ["from-rule"]
        missing = subprocess.run(
            [*command, "--config", str(tmp_path / "absent.toml")], capture_output=True, text=True
        )
        assert missing.returncode == 2 and "does not exist" in missing.stderr


@pytest.mark.root
def test_what_the_agent_lacks_to_read_other_processes_is_read_from_its_capabilities() -> None:
    """The effective set the kernel gives the process (/proc/self/status), as the agent runs
    it: root has both capabilities; without them in its bounding set (a unit's
    CapabilityBoundingSet=, a container's dropped capabilities) it names what it lacks."""
    assert missing_read_capabilities() == []
    script = (
        "from tensorlights.discovery.procfs import missing_read_capabilities; "
        "print(','.join(missing_read_capabilities()))"
    )
    for dropped, lacking in (
        ("-dac_read_search,-sys_ptrace", "CAP_DAC_READ_SEARCH,CAP_SYS_PTRACE"),
        ("-sys_ptrace", "CAP_SYS_PTRACE"),
    ):
        run = subprocess.run(
            ["setpriv", f"--bounding-set={dropped}", sys.executable, "-c", script],
            capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        assert run.stdout.strip() == lacking
