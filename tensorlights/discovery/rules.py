"""Which training job a process belongs to and its role in it, from what launchers set (pure).

Precedence, first that applies:
  role: TENSORLIGHTS_ROLE > operator rule > the Slurm plugin's record of the job step
        (`srun --tensorlights-ps-tasks`) > TF_CONFIG > DMLC_ROLE > Horovod > torchrun/
        torch.distributed (DeepSpeed's launcher sets the same variables) > MPI > Slurm role
        rule (SLURM_PROCID in `slurm_ps_procids`)
  job:  TENSORLIGHTS_JOB > operator rule > Slurm job id (env or cgroup; the resource manager's
        name, which the controller also learns from Slurm) > the framework's own identity

Two kinds of job carry traffic: a PS job's PS processes push to its workers, and every rank of
a collective job (all-reduce: DDP, FSDP, DeepSpeed, Horovod, MPI) sends to the other ranks.
Either way the process's own sockets are the job's traffic on the host (`Identity.carries`).
A launcher variable that is present but malformed is a *problem* (reported to the operator),
never silently a non-PS. An identity is then believed only as far as `rules.trust` allows
(discovery/trust.py): one nothing vouches for is a problem too.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from string import Template
from typing import Any

from tensorlights.discovery.trust import Trust, distrust, slurm_task
from tensorlights.errors import ConfigError
from tensorlights.model import JobKind, job_id_problem

PS = "ps"
RANK = "rank"
"""A rank of a collective job: it sends to the job's other ranks, as a PS to its workers."""
WORKER = "worker"
CHIEF = "chief"
SCHEDULER = "scheduler"
EVALUATOR = "evaluator"
TASK = "task"
"""A task of a resource-manager job whose role nothing tells."""

ROLES = (PS, WORKER, RANK, CHIEF, SCHEDULER, EVALUATOR, TASK)
"""The roles a process can have; an operator rule names one of them."""

DEFAULT_SPANK_DIR = "/run/tensorlights/slurm"
"""Where the Slurm plugin (deploy/slurm) records job steps' PS tasks unless told `dir=`."""

ENV_JOB = "TENSORLIGHTS_JOB"
ENV_ROLE = "TENSORLIGHTS_ROLE"
ENV_ITERATIONS = "TENSORLIGHTS_ITERATIONS"
"""The job's total iterations (synchronous steps: rounds of the PS's pushes), where its
launcher or user states them: `pack`'s starvation guard then judges the job by its deadline
(policy/packing.StarvationGuard)."""

_TORCHRUN_DEFAULT_ROLE = "default"
_TF_ROLES = {"ps": PS, "worker": WORKER, "chief": CHIEF, "master": CHIEF, "evaluator": EVALUATOR}
_DMLC_ROLES = {"server": PS, "worker": WORKER, "scheduler": SCHEDULER}


@dataclass(frozen=True)
class ProcessFacts:
    pid: int
    name: str
    exe: str
    cmdline: tuple[str, ...]
    environ: Mapping[str, str]
    cgroup: str
    uid: int
    """Real user id."""
    declared_ps_tasks: frozenset[int] | None = None
    """The tasks (SLURM_PROCIDs) that Slurm's TensorLights plugin recorded as PS for the job
    step this process runs in (discovery/spank_records.py); None where it recorded nothing."""


@dataclass(frozen=True)
class Identity:
    job: str
    role: str
    source: str
    """Which rule decided the role: env, rule:<name>, slurm_spank, tf_config, dmlc, torch,
    slurm."""
    peers: tuple[str, ...] = ()
    """The job's worker endpoints (host:port) where the launcher's spec names them."""
    rdma: str | None = None
    """Why the job's traffic bypasses the kernel here (NCCL over InfiniBand/RoCE), if it does."""
    iterations: int | None = None
    """The job's total iterations where it declares them (ENV_ITERATIONS)."""

    @property
    def carries(self) -> bool:
        """Its own sockets are the job's traffic: a PS, or a rank of a collective job."""
        return self.role in (PS, RANK)

    @property
    def kind(self) -> JobKind:
        return JobKind.COLLECTIVE if self.role == RANK else JobKind.PS


@dataclass(frozen=True)
class Verdict:
    identity: Identity | None
    problem: str | None = None
    untrusted: bool = False
    """An identity was found but not believed (see `DiscoveryRules.trust`)."""


@dataclass(frozen=True)
class OperatorRule:
    """Matches when every given condition holds; `job` is a template over the environment
    and the named groups of `cmdline_regex`, e.g. "train-${JOB_NAME}"."""

    name: str
    role: str
    job: str
    exe: str | None = None
    cmdline_regex: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.name:
            raise ConfigError("an operator rule needs a name")
        if not (self.exe or self.cmdline_regex or self.env):
            raise ConfigError(f"rule {self.name}: give at least one of exe, cmdline_regex, env")
        if not self.role or not self.job:
            raise ConfigError(f"rule {self.name}: role and job are required")
        if self.role not in ROLES:
            raise ConfigError(f"rule {self.name}: role must be one of {', '.join(ROLES)}")
        if self.cmdline_regex is not None:
            try:
                re.compile(self.cmdline_regex)
            except re.error as exc:
                raise ConfigError(f"rule {self.name}: bad cmdline_regex: {exc}") from exc
        if not Template(self.job).is_valid():
            raise ConfigError(f"rule {self.name}: job template {self.job!r} is malformed")


@dataclass(frozen=True)
class DiscoveryRules:
    torch_ps_roles: frozenset[str] = frozenset({"ps", "server", "parameter_server"})
    """torchrun ROLE_NAME values that mean parameter server."""
    torch_ps_ranks: frozenset[int] = frozenset()
    """RANK values that mean parameter server (e.g. {0} where rank 0 serves the model)."""
    slurm_ps_procids: frozenset[int] = frozenset()
    """SLURM_PROCID values that mean parameter server, for jobs with no framework variables."""
    slurm_spank_dir: str = DEFAULT_SPANK_DIR
    """Where the Slurm plugin records each job step's PS tasks (its `dir=` argument)."""
    operator_rules: tuple[OperatorRule, ...] = ()
    trust: Trust = field(default_factory=Trust)
    """Whose claims are believed; by default only what a resource manager vouches for."""


def identify(facts: ProcessFacts, rules: DiscoveryRules) -> Verdict:
    env = facts.environ
    problems: list[str] = []
    framework = _framework(env, rules, problems)
    slurm_job = _slurm_job(env, facts.cgroup)

    role: str | None = None
    job: str | None = None
    source = ""
    peers: tuple[str, ...] = ()
    if framework is not None:
        role, job, source, peers = framework.role, framework.job, framework.source, framework.peers
    if slurm_job is not None:
        job = f"slurm/{slurm_job}"
        declared = _declared_role(env, facts.declared_ps_tasks, role, problems)
        if declared is not None:
            role, source = declared, "slurm_spank"
        elif role is None:
            role, source = _slurm_role(env, rules, problems), "slurm"

    for rule in rules.operator_rules:
        if not _rule_matches(rule, facts):
            continue
        matched = _rule_job(rule, facts)
        if matched is None:
            problems.append(
                f"rule {rule.name} matches but its job template {rule.job!r} "
                "names a variable this process lacks"
            )
            continue
        role, job, source = rule.role, matched, f"rule:{rule.name}"
        break

    explicit_role = env.get(ENV_ROLE, "").strip().lower()
    explicit_job = env.get(ENV_JOB, "").strip()
    if explicit_role:
        role, source = explicit_role, "env"
    if explicit_job:
        job = explicit_job
        source = source or "env"

    problem = "; ".join(problems) or None
    if role is None:
        return Verdict(None, problem)
    if job is None:
        return Verdict(None, f"role {role} from {source} but no job id: set {ENV_JOB}")
    if bad_job := job_id_problem(job):
        return Verdict(None, bad_job)
    if reason := distrust(job, source, facts.uid, facts.cgroup, rules.trust):
        return Verdict(None, "; ".join(filter(None, (problem, reason))), untrusted=True)
    identity = Identity(
        job=job,
        role=role,
        source=source,
        peers=peers,
        rdma=nccl_rdma(env),
        iterations=_declared_iterations(env, problems),
    )
    return Verdict(identity, "; ".join(problems) or None)


def _declared_iterations(env: Mapping[str, str], problems: list[str]) -> int | None:
    """ENV_ITERATIONS as a count; a value that is not one is a problem, and not used."""
    raw = env.get(ENV_ITERATIONS, "").strip()
    if not raw:
        return None
    if raw.isdigit() and int(raw) > 0:
        return int(raw)
    problems.append(f"{ENV_ITERATIONS}={raw[:40]!r} is not a positive whole number: ignored")
    return None


@dataclass(frozen=True)
class _Framework:
    role: str
    job: str | None
    """None: the launcher names no job (MPI started by Hydra); Slurm or TENSORLIGHTS_JOB may."""
    source: str
    peers: tuple[str, ...] = ()


def _framework(
    env: Mapping[str, str], rules: DiscoveryRules, problems: list[str]
) -> _Framework | None:
    if "TF_CONFIG" in env:
        found = _tf_config(env["TF_CONFIG"], problems)
        if found is not None:
            return found
    if "DMLC_ROLE" in env:
        found = _dmlc(env, problems)
        if found is not None:
            return found
    if "HOROVOD_RANK" in env:
        return _horovod(env, problems)
    if "TORCHELASTIC_RUN_ID" in env or {"MASTER_ADDR", "MASTER_PORT", "RANK"} <= env.keys():
        return _torch(env, rules, problems)
    if _MPI_RANK.keys() & env.keys():
        return _mpi(env, problems)
    return None


def _tf_config(text: str, problems: list[str]) -> _Framework | None:
    try:
        config: Any = json.loads(text)
        cluster = config.get("cluster") or {}
        task = config.get("task") or {}
        task_type = str(task["type"]).lower()
        index = int(task.get("index", 0))  # some launchers write "0"
        if not isinstance(cluster, dict) or not all(isinstance(v, list) for v in cluster.values()):
            raise ValueError("cluster must map task types to address lists")
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        problems.append(f"TF_CONFIG is malformed ({exc.__class__.__name__}: {exc})")
        return None
    role = _TF_ROLES.get(task_type)
    if role is None:
        problems.append(f"TF_CONFIG task type {task_type!r} is unknown")
        return None
    members = cluster.get(task_type, [])
    if not 0 <= index < len(members):
        problems.append(f"TF_CONFIG task {task_type}:{index} is not in its cluster spec")
        return None
    canonical = json.dumps(cluster, sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(canonical.encode()).hexdigest()[:12]
    peers = tuple(
        str(address) for kind in ("chief", "master", "worker") for address in cluster.get(kind, [])
    )
    return _Framework(role=role, job=f"tf/{digest}", source="tf_config", peers=peers)


def _dmlc(env: Mapping[str, str], problems: list[str]) -> _Framework | None:
    role = _DMLC_ROLES.get(env["DMLC_ROLE"].strip().lower())
    uri, port = env.get("DMLC_PS_ROOT_URI", ""), env.get("DMLC_PS_ROOT_PORT", "")
    if role is None:
        problems.append(f"DMLC_ROLE {env['DMLC_ROLE']!r} is not server, worker or scheduler")
        return None
    if not uri or not port.isdigit():
        problems.append("DMLC_ROLE is set but DMLC_PS_ROOT_URI/DMLC_PS_ROOT_PORT are not")
        return None
    return _Framework(role=role, job=f"dmlc/{uri}:{port}", source="dmlc")


def _torch(env: Mapping[str, str], rules: DiscoveryRules, problems: list[str]) -> _Framework | None:
    run_id = env.get("TORCHELASTIC_RUN_ID", "").strip()
    if run_id and run_id != "none":
        job = f"torch/{run_id}"
    elif env.get("MASTER_ADDR") and env.get("MASTER_PORT"):
        job = f"torch/{env['MASTER_ADDR']}:{env['MASTER_PORT']}"
    else:
        problems.append("torchrun variables without a run id or MASTER_ADDR/MASTER_PORT")
        return None
    role_name = env.get("ROLE_NAME", "").strip().lower()
    rank_text = env.get("RANK", "").strip()
    if role_name in rules.torch_ps_roles:
        return _Framework(role=PS, job=job, source="torch")
    if rules.torch_ps_ranks:  # the operator says this host's torch jobs are PS jobs
        if not rank_text.lstrip("-").isdigit():
            problems.append(f"RANK {rank_text!r} is not a number")
            return None
        role = PS if int(rank_text) in rules.torch_ps_ranks else WORKER
        return _Framework(role=role, job=job, source="torch")
    if role_name and role_name != _TORCHRUN_DEFAULT_ROLE:
        # torchrun --role names roles only in a job of several kinds of process: a PS job
        # whose PS has one of torch_ps_roles; this one is its worker.
        return _Framework(role=WORKER, job=job, source="torch")
    return _Framework(role=RANK, job=job, source="torch")  # DDP, FSDP, DeepSpeed


def _horovod(env: Mapping[str, str], problems: list[str]) -> _Framework | None:
    """horovodrun's Gloo mode: HOROVOD_RANK, and the launcher's rendezvous server, the same
    for every rank on every host. Under mpirun the MPI job id names it instead."""
    if not env["HOROVOD_RANK"].strip().isdigit():
        problems.append(f"HOROVOD_RANK {env['HOROVOD_RANK']!r} is not a number")
        return None
    addr = env.get("HOROVOD_GLOO_RENDEZVOUS_ADDR", "").strip()
    port = env.get("HOROVOD_GLOO_RENDEZVOUS_PORT", "").strip()
    if addr and port.isdigit():
        return _Framework(role=RANK, job=f"horovod/{addr}:{port}", source="horovod")
    mpi = _mpi(env, []) if _MPI_RANK.keys() & env.keys() else None
    return _Framework(role=RANK, job=mpi.job if mpi else None, source="horovod")


_MPI_RANK = {
    "OMPI_COMM_WORLD_RANK": "OMPI_COMM_WORLD_SIZE",
    "PMI_RANK": "PMI_SIZE",
    "PMIX_RANK": "",
}
"""Rank variable -> size variable of Open MPI, MPICH/Intel MPI (and Slurm's PMI) and PMIx."""
_MPI_JOB = ("PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid", "OMPI_MCA_orte_ess_jobid", "PMI_KVSNAME")
"""Variables naming the MPI job the same way in every rank: PMIx's namespace (Open MPI 4-5,
Slurm with --mpi=pmix), Open MPI's job ids, the PMI-1 key-value space (MPICH's Hydra)."""


def _mpi(env: Mapping[str, str], problems: list[str]) -> _Framework | None:
    rank_var = next(var for var in _MPI_RANK if var in env)
    size_var = _MPI_RANK[rank_var]
    rank, size = env[rank_var].strip(), env.get(size_var, "").strip() if size_var else ""
    if not rank.isdigit() or (size and not size.isdigit()):
        problems.append(f"{rank_var}={rank!r} {size_var}={size!r}: not numbers")
        return None
    if size == "1":
        return None  # one process alone: no traffic between ranks
    job_id = next((env[var].strip() for var in _MPI_JOB if env.get(var, "").strip()), None)
    return _Framework(role=RANK, job=f"mpi/{job_id}" if job_id else None, source="mpi")


def nccl_rdma(env: Mapping[str, str]) -> str | None:
    """Why NCCL's traffic of this process bypasses the kernel (InfiniBand/RoCE verbs), as far
    as its environment tells: NCCL uses an IB device when it finds one unless told not to, and
    NCCL_IB_* variables are set only where one is meant to be used. The open device itself is
    the sure sign; the scanner checks the file table for it (procfs.RDMA_DEVICE)."""
    if env.get("NCCL_IB_DISABLE", "").strip() == "1":
        return None
    net = env.get("NCCL_NET", "").strip()
    if net.lower() == "socket":
        return None
    named = sorted(key for key in env if key.startswith("NCCL_IB_") and key != "NCCL_IB_DISABLE")
    if net.upper() == "IB":
        named.insert(0, "NCCL_NET=IB")
    if not named:
        return None
    return f"NCCL over InfiniBand/RoCE ({', '.join(named[:3])}) bypasses the kernel's qdisc"


def _slurm_job(env: Mapping[str, str], cgroup: str) -> str | None:
    job_id = env.get("SLURM_JOB_ID", "").strip()
    if job_id.isdigit():
        return job_id
    task = slurm_task(cgroup)
    return None if task is None else str(task.job_id)


def _declared_role(
    env: Mapping[str, str],
    ps_tasks: frozenset[int] | None,
    framework_role: str | None,
    problems: list[str],
) -> str | None:
    """The role the plugin's record gives this task: PS if listed; otherwise whatever the
    framework says short of PS (the user declared which tasks are PS), else a plain task."""
    if ps_tasks is None:
        return None
    procid = env.get("SLURM_PROCID", "").strip()
    if not procid.isdigit():
        problems.append(
            "the Slurm plugin declared PS tasks for this step but the task has no SLURM_PROCID"
        )
        return None
    if int(procid) in ps_tasks:
        return PS
    if framework_role is None or framework_role == PS:
        return TASK
    return framework_role


def _slurm_role(env: Mapping[str, str], rules: DiscoveryRules, problems: list[str]) -> str:
    procid = env.get("SLURM_PROCID", "").strip()
    # Only a task of a job step (srun) has SLURM_STEP_ID; the batch script and srun itself
    # carry the job's variables, SLURM_PROCID=0 included, but are not tasks.
    if not rules.slurm_ps_procids or not env.get("SLURM_STEP_ID", "").strip().isdigit():
        return TASK
    if not procid.isdigit():
        problems.append("slurm_ps_procids is configured but the task has no SLURM_PROCID")
        return TASK
    return PS if int(procid) in rules.slurm_ps_procids else TASK


def _rule_matches(rule: OperatorRule, facts: ProcessFacts) -> bool:
    if rule.exe is not None and rule.exe not in (facts.exe, facts.name):
        return False
    if any(facts.environ.get(key) != value for key, value in rule.env.items()):
        return False
    return rule.cmdline_regex is None or re.search(rule.cmdline_regex, _cmdline(facts)) is not None


def _rule_job(rule: OperatorRule, facts: ProcessFacts) -> str | None:
    groups: dict[str, str] = {}
    if rule.cmdline_regex is not None:
        match = re.search(rule.cmdline_regex, _cmdline(facts))
        if match is not None:
            groups = {k: v for k, v in match.groupdict().items() if v is not None}
    try:
        return Template(rule.job).substitute({**facts.environ, **groups})
    except (KeyError, ValueError):
        return None


def _cmdline(facts: ProcessFacts) -> str:
    return " ".join(facts.cmdline)


def launcher_job(
    env: Mapping[str, str], rules: DiscoveryRules | None = None
) -> tuple[str, str] | None:
    """(job, role) a launcher's environment (TF_CONFIG, DMLC, torch) gives a process: the
    controller's Kubernetes source names pods' jobs with it exactly as agents name them."""
    found = _framework(env, rules or DiscoveryRules(), [])
    return None if found is None or found.job is None else (found.job, found.role)
