"""Classification rules: launcher environments -> (job, role), precedence, malformed input;
what status says of processes discovery could not read."""

from __future__ import annotations

import json
import random
from collections.abc import Mapping

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tensorlights.discovery.rules import (
    DiscoveryRules,
    OperatorRule,
    ProcessFacts,
    Verdict,
    identify,
)
from tensorlights.discovery.scanner import HIDDEN_SHOWN, hidden_problem
from tensorlights.discovery.trust import TRUST_ANY
from tensorlights.errors import ConfigError
from tensorlights.model import DiscoverySnapshot, PsConnection, PsTask


def facts(
    env: Mapping[str, str] = {},
    cgroup: str = "0::/user.slice\n",
    cmdline: tuple[str, ...] = ("python", "train.py"),
    exe: str = "python3.11",
    uid: int = 1000,
) -> ProcessFacts:
    return ProcessFacts(
        pid=1, name="python", exe=exe, cmdline=cmdline, environ=env, cgroup=cgroup, uid=uid
    )


BELIEVE_ALL = DiscoveryRules(trust=TRUST_ANY)


def verdict(env: Mapping[str, str], rules: DiscoveryRules | None = None, **kw: str) -> Verdict:
    """Identification alone: every claim believed (trust is tested on its own below)."""
    return identify(facts(env, **kw), rules or BELIEVE_ALL)  # type: ignore[arg-type]


def tf(task: dict[str, object], cluster: dict[str, list[str]] | None = None) -> dict[str, str]:
    cluster = cluster or {"ps": ["p0:1", "p1:1"], "worker": ["w0:1", "w1:1"], "chief": ["c:1"]}
    return {"TF_CONFIG": json.dumps({"cluster": cluster, "task": task})}


@pytest.mark.parametrize(
    ("task", "role"),
    [
        ({"type": "ps", "index": 1}, "ps"),
        ({"type": "ps", "index": "0"}, "ps"),
        ({"type": "worker", "index": 0}, "worker"),
        ({"type": "chief", "index": 0}, "chief"),
    ],
)
def test_tf_config_roles(task: dict[str, object], role: str) -> None:
    result = verdict(tf(task))
    assert result.identity is not None and result.problem is None
    assert result.identity.role == role and result.identity.source == "tf_config"
    assert result.identity.job.startswith("tf/")
    assert set(result.identity.peers) == {"w0:1", "w1:1", "c:1"}


def test_tf_config_old_master_key_is_the_chief() -> None:
    result = verdict(tf({"type": "master", "index": 0}, {"master": ["m:1"], "ps": ["p:1"]}))
    assert result.identity is not None and result.identity.role == "chief"


@given(st.permutations(["ps", "worker", "chief"]), st.sampled_from(["ps", "worker"]))
def test_tf_job_id_is_the_same_for_every_member_whatever_the_key_order(
    order: list[str], task_type: str
) -> None:
    spec = {"ps": ["p0:1"], "worker": ["w0:1", "w1:1"], "chief": ["c:1"]}
    shuffled = {key: spec[key] for key in order}
    a = verdict(tf({"type": "ps", "index": 0}, spec)).identity
    b = verdict(tf({"type": task_type, "index": 0}, shuffled)).identity
    assert a is not None and b is not None and a.job == b.job


def test_different_clusters_are_different_jobs() -> None:
    a = verdict(tf({"type": "ps", "index": 0}, {"ps": ["a:1"], "worker": ["w:1"]})).identity
    b = verdict(tf({"type": "ps", "index": 0}, {"ps": ["b:1"], "worker": ["w:1"]})).identity
    assert a is not None and b is not None and a.job != b.job


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("{not json", "TF_CONFIG is malformed"),
        ('{"cluster": {"ps": ["a:1"]}}', "TF_CONFIG is malformed"),
        ('{"cluster": {"ps": "a:1"}, "task": {"type": "ps"}}', "TF_CONFIG is malformed"),
        ('{"cluster": {"ps": ["a:1"]}, "task": {"type": "ps", "index": 3}}', "not in its"),
        ('{"cluster": {"ps": ["a:1"]}, "task": {"type": "ps", "index": "x"}}', "malformed"),
        ('{"cluster": {"ps": ["a:1"]}, "task": {"type": "gpu", "index": 0}}', "unknown"),
    ],
)
def test_malformed_tf_config_is_a_problem_not_a_silent_miss(text: str, problem: str) -> None:
    result = verdict({"TF_CONFIG": text})
    assert result.identity is None
    assert result.problem is not None and problem in result.problem


@pytest.mark.parametrize(
    ("env", "job", "role"),
    [
        (
            {"DMLC_ROLE": "server", "DMLC_PS_ROOT_URI": "10.1.1.1", "DMLC_PS_ROOT_PORT": "9091"},
            "dmlc/10.1.1.1:9091",
            "ps",
        ),
        (
            {"DMLC_ROLE": "Worker", "DMLC_PS_ROOT_URI": "10.1.1.1", "DMLC_PS_ROOT_PORT": "9091"},
            "dmlc/10.1.1.1:9091",
            "worker",
        ),
        (
            {"DMLC_ROLE": "scheduler", "DMLC_PS_ROOT_URI": "h", "DMLC_PS_ROOT_PORT": "1"},
            "dmlc/h:1",
            "scheduler",
        ),
        ({"TORCHELASTIC_RUN_ID": "r1", "ROLE_NAME": "ps", "RANK": "4"}, "torch/r1", "ps"),
        # torchrun --role trainer: a job of several roles (a PS job): its worker.
        ({"TORCHELASTIC_RUN_ID": "r1", "ROLE_NAME": "trainer"}, "torch/r1", "worker"),
        # No PS anywhere in sight: DDP/FSDP under torchrun, DeepSpeed's launcher, plain
        # torch.distributed: every rank carries the job's all-reduce.
        ({"TORCHELASTIC_RUN_ID": "r1", "ROLE_NAME": "default"}, "torch/r1", "rank"),
        (
            {"TORCHELASTIC_RUN_ID": "none", "MASTER_ADDR": "m", "MASTER_PORT": "5", "RANK": "0"},
            "torch/m:5",
            "rank",
        ),
        (
            {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "MASTER_ADDR": "10.0.0.5"}
            | {"MASTER_PORT": "29500", "CROSS_RANK": "1"},  # DeepSpeed's launcher
            "torch/10.0.0.5:29500",
            "rank",
        ),
        (
            {"HOROVOD_RANK": "2", "HOROVOD_SIZE": "4", "HOROVOD_LOCAL_RANK": "0"}
            | {"HOROVOD_GLOO_RENDEZVOUS_ADDR": "10.0.0.1", "HOROVOD_GLOO_RENDEZVOUS_PORT": "4321"},
            "horovod/10.0.0.1:4321",
            "rank",
        ),
        (  # horovodrun over Open MPI
            {"HOROVOD_RANK": "1", "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4"}
            | {"PMIX_NAMESPACE": "prterun-n1-4711@1"},
            "mpi/prterun-n1-4711@1",
            "rank",
        ),
        (
            {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2"}
            | {"OMPI_MCA_ess_base_jobid": "3045654529"},
            "mpi/3045654529",
            "rank",
        ),
        ({"PMI_RANK": "5", "PMI_SIZE": "8", "PMI_KVSNAME": "kvs_812_0"}, "mpi/kvs_812_0", "rank"),
        (  # MPI under srun: the Slurm job names it
            {"PMI_RANK": "5", "PMI_SIZE": "8", "SLURM_JOB_ID": "77", "SLURM_PROCID": "5"}
            | {"SLURM_STEP_ID": "0"},
            "slurm/77",
            "rank",
        ),
        ({"SLURM_JOB_ID": "77", "SLURM_PROCID": "0"}, "slurm/77", "task"),
        ({"TENSORLIGHTS_JOB": "mine", "TENSORLIGHTS_ROLE": "PS"}, "mine", "ps"),
    ],
)
def test_launcher_environments(env: dict[str, str], job: str, role: str) -> None:
    result = verdict(env)
    assert result.identity is not None, result.problem
    assert (result.identity.job, result.identity.role) == (job, role)


def test_collective_launchers_without_a_job_id_or_with_bad_ranks_are_problems() -> None:
    hydra = verdict({"PMI_RANK": "1", "PMI_SIZE": "2"})  # MPICH's Hydra names no job
    assert hydra.identity is None and "TENSORLIGHTS_JOB" in (hydra.problem or "")
    named = verdict({"PMI_RANK": "1", "PMI_SIZE": "2", "TENSORLIGHTS_JOB": "train-7"})
    assert named.identity is not None and named.identity.job == "train-7"
    assert named.identity.carries and named.identity.kind == "collective"
    bad = verdict({"OMPI_COMM_WORLD_RANK": "one", "PMIX_NAMESPACE": "x"})
    assert bad.identity is None and "OMPI_COMM_WORLD_RANK" in (bad.problem or "")
    bad = verdict({"HOROVOD_RANK": "", "HOROVOD_GLOO_RENDEZVOUS_ADDR": "a"})
    assert bad.identity is None and "HOROVOD_RANK" in (bad.problem or "")
    # One process alone talks to nobody: not a rank of anything.
    alone = verdict(
        {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1", "PMIX_NAMESPACE": "x"}
    )
    assert alone.identity is None and alone.problem is None


@pytest.mark.parametrize(
    ("env", "rdma"),
    [
        ({}, False),
        ({"NCCL_IB_HCA": "mlx5_0,mlx5_1"}, True),
        ({"NCCL_NET": "IB"}, True),
        ({"NCCL_IB_HCA": "mlx5_0", "NCCL_IB_DISABLE": "1"}, False),
        ({"NCCL_IB_GID_INDEX": "3", "NCCL_NET": "Socket"}, False),
        ({"NCCL_SOCKET_IFNAME": "eth0"}, False),
    ],
)
def test_nccl_over_infiniband_is_told_from_the_environment(env: dict[str, str], rdma: bool) -> None:
    torch = {"MASTER_ADDR": "m", "MASTER_PORT": "5", "RANK": "1"}
    identity = verdict({**torch, **env}).identity
    assert identity is not None and identity.role == "rank"
    assert (identity.rdma is not None) == rdma
    if rdma:
        assert "bypasses the kernel" in (identity.rdma or "")


def test_torch_rank_rule_and_slurm_procid_rule() -> None:
    rules = DiscoveryRules(
        trust=TRUST_ANY, torch_ps_ranks=frozenset({0}), slurm_ps_procids=frozenset({0, 1})
    )
    torch = {"MASTER_ADDR": "m", "MASTER_PORT": "5"}
    assert verdict({**torch, "RANK": "0"}, rules).identity.role == "ps"  # type: ignore[union-attr]
    assert verdict({**torch, "RANK": "2"}, rules).identity.role == "worker"  # type: ignore[union-attr]
    bad = verdict({**torch, "RANK": "x", "TORCHELASTIC_RUN_ID": "r"}, rules)
    assert bad.identity is None and "RANK" in (bad.problem or "")
    slurm = {"SLURM_JOB_ID": "9", "SLURM_STEP_ID": "0"}
    assert verdict({**slurm, "SLURM_PROCID": "1"}, rules).identity.role == "ps"  # type: ignore[union-attr]
    assert verdict({**slurm, "SLURM_PROCID": "2"}, rules).identity.role == "task"  # type: ignore[union-attr]
    # The batch script and srun carry SLURM_PROCID=0 too, but no step id: not tasks.
    batch = {"SLURM_JOB_ID": "9", "SLURM_PROCID": "0"}
    assert verdict(batch, rules).identity.role == "task"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "cgroup",
    [
        "0::/system.slice/slurmstepd.scope/job_812/step_0/user/task_3\n",
        "4:freezer:/slurm/uid_1000/job_812/step_batch/task_0\n0::/\n",
        "6:freezer:/slurm_n1/uid_65534/job_812/step_0\n0::/\n",  # proctrack/cgroup, as measured
    ],
)
def test_slurm_job_from_cgroup_v1_and_v2(cgroup: str) -> None:
    result = verdict(tf({"type": "ps", "index": 0}), cgroup=cgroup)
    assert result.identity is not None
    assert (result.identity.job, result.identity.role) == ("slurm/812", "ps")


def test_slurmstepd_itself_is_not_a_task() -> None:
    for cgroup in (
        "0::/system.slice/slurmstepd.scope/job_812/step_0/slurm\n",
        "6:freezer:/slurm_n1/uid_0/job_812\n",
    ):
        assert verdict({}, cgroup=cgroup).identity is None


def test_slurm_job_id_names_a_framework_job_and_explicit_env_wins_over_all() -> None:
    env = {**tf({"type": "ps", "index": 0}), "SLURM_JOB_ID": "55"}
    assert verdict(env).identity.job == "slurm/55"  # type: ignore[union-attr]
    explicit = {**env, "TENSORLIGHTS_JOB": "x", "TENSORLIGHTS_ROLE": "worker"}
    identity = verdict(explicit).identity
    assert identity is not None and (identity.job, identity.role) == ("x", "worker")


@pytest.mark.parametrize(
    ("value", "iterations", "problem"),
    [("3000", 3000, False), (" 25 ", 25, False), ("", None, False), ("0", None, True),
     ("-5", None, True), ("1e4", None, True), ("many", None, True)],
)  # fmt: skip
def test_a_job_declares_its_iterations_in_its_environment(
    value: str, iterations: int | None, problem: bool
) -> None:
    torch = {"MASTER_ADDR": "m", "MASTER_PORT": "5", "RANK": "1", "TENSORLIGHTS_ITERATIONS": value}
    result = verdict(torch)
    assert result.identity is not None and result.identity.iterations == iterations
    assert ("TENSORLIGHTS_ITERATIONS" in (result.problem or "")) == problem


def test_a_snapshot_takes_the_fewest_iterations_a_job_declares() -> None:
    def task(pid: int, job: str, iterations: int | None) -> PsTask:
        return PsTask(pid, 0.0, job, "env", 1, True, frozenset(), (), iterations=iterations)

    tasks = (task(1, "a", 40), task(2, "a", 30), task(3, "b", None), task(4, "c", 7))
    assert DiscoverySnapshot(tasks).declared_iterations == {"a": 30, "c": 7}


def test_explicit_role_without_any_job_is_a_problem() -> None:
    result = verdict({"TENSORLIGHTS_ROLE": "ps"})
    assert result.identity is None and "TENSORLIGHTS_JOB" in (result.problem or "")


def test_operator_rules_match_on_exe_env_and_cmdline_and_template_the_job() -> None:
    rule = OperatorRule(
        name="mx",
        role="ps",
        job="mx-${CLUSTER}-${shard}",
        exe="python3.11",
        env={"TEAM": "vision"},
        cmdline_regex=r"--shard=(?P<shard>\d+)",
    )
    rules = DiscoveryRules(trust=TRUST_ANY, operator_rules=(rule,))
    env = {"TEAM": "vision", "CLUSTER": "c1"}
    cmd = ("python", "serve.py", "--shard=7")
    identity = identify(facts(env, cmdline=cmd), rules).identity
    assert identity is not None and (identity.job, identity.source) == ("mx-c1-7", "rule:mx")
    assert identify(facts({**env, "TEAM": "nlp"}, cmdline=cmd), rules).identity is None
    assert identify(facts(env, cmdline=cmd, exe="java"), rules).identity is None
    missing = identify(facts({"TEAM": "vision"}, cmdline=cmd), rules)
    assert missing.identity is None and "template" in (missing.problem or "")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"name": "", "role": "ps", "job": "j", "exe": "x"},
        {"name": "r", "role": "ps", "job": "j"},
        {"name": "r", "role": "ps", "job": "j", "cmdline_regex": "("},
        {"name": "r", "role": "ps", "job": "${", "exe": "x"},
    ],
)
def test_bad_operator_rules_are_config_errors(kwargs: dict[str, str]) -> None:
    with pytest.raises(ConfigError):
        OperatorRule(**kwargs)  # type: ignore[arg-type]


@given(st.dictionaries(st.text(max_size=20), st.text(max_size=60), max_size=12))
def test_arbitrary_environments_never_raise(env: dict[str, str]) -> None:
    keys = ["TF_CONFIG", "DMLC_ROLE", "TORCHELASTIC_RUN_ID", "RANK", "SLURM_JOB_ID"]
    rng = random.Random(len(env))
    for key in rng.sample(keys, 2):
        env[key] = rng.choice(["", "0", "{}", "ps", '{"task": 1}', "[1]", "null"])
    identify(facts(env), DiscoveryRules(trust=TRUST_ANY, torch_ps_ranks=frozenset({0})))


def _task(job: str, pid: int, ports: set[int], in_ns: bool = True) -> PsTask:
    return PsTask(
        pid=pid,
        create_time=0.0,
        job=job,
        source="env",
        netns=1,
        in_agent_netns=in_ns,
        listen_ports=frozenset(ports),
        connections=(PsConnection(40000 + pid, "10.0.0.1", 5),),
    )


def test_snapshot_ports_by_job_drop_contested_and_foreign_namespace_ports() -> None:
    snapshot = DiscoverySnapshot(
        tasks=(
            _task("a", 1, {5000}),
            _task("a", 2, {5001}),
            _task("b", 3, {6000}),
            _task("b", 4, {7000}),
            _task("c", 40001 - 40000, {8000}, in_ns=False),
        )
    )
    assert snapshot.jobs() == ("a", "b", "c")
    # pid 1's connection port 40001 is contested by nobody in the agent's namespace.
    assert snapshot.job_ports() == {
        "a": frozenset({5000, 5001, 40001, 40002}),
        "b": frozenset({6000, 7000, 40003, 40004}),
    }
    clash = DiscoverySnapshot(tasks=(_task("a", 1, {5000}), _task("b", 2, {5000})))
    assert clash.contested_ports() == {5000}
    assert clash.job_ports() == {"a": frozenset({40001}), "b": frozenset({40002})}


def test_unreadable_processes_are_named_with_what_to_do() -> None:
    lacking = hidden_problem([7, 9], ["CAP_SYS_PTRACE"])
    assert lacking.startswith("2 processes could not be read (permission denied; pids 7, 9)")
    assert "lacks CAP_SYS_PTRACE; run it as root or grant them" in lacking
    # Where it lacks nothing, granting is not the answer (a Firecracker VM's PID 1 is
    # refused to root); a long list is cut.
    many = list(range(100, 100 + HIDDEN_SHOWN + 3))
    hidden = hidden_problem(many, [])
    assert hidden.startswith(f"{len(many)} processes could not be read even with ")
    assert f"(pids {', '.join(map(str, many[:HIDDEN_SHOWN]))}, ...)" in hidden
    assert "grant" not in hidden and "refuses them to root too" in hidden
