"""Whose claims discovery believes (issue 19, item 5): under the default trust only what a
Slurm job cgroup or the operator's trusted_users vouches for gets a job identity."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from tensorlights.discovery.rules import DiscoveryRules, ProcessFacts, Verdict, identify
from tensorlights.discovery.trust import (
    NO_SUCH_USER,
    TRUST_ANY,
    JobVoucher,
    Trust,
    TrustMode,
    pod_uid,
)
from tensorlights.model import VoucherSource

STRICT = DiscoveryRules()
V1_TASK = "6:freezer:/slurm_n1/uid_1000/job_812/step_0\n0::/\n"
V2_TASK = "0::/system.slice/slurmstepd.scope/job_812/step_0/user/task_3\n"
CLAIM_PS = {"TENSORLIGHTS_JOB": "mine", "TENSORLIGHTS_ROLE": "ps"}


def judge(
    env: Mapping[str, str], rules: DiscoveryRules = STRICT, *, uid: int = 1000, cgroup: str = ""
) -> Verdict:
    facts = ProcessFacts(1, "python", "python3", ("python",), env, cgroup or "0::/\n", uid)
    return identify(facts, rules)


def test_the_default_is_to_trust_only_what_a_resource_manager_vouches_for() -> None:
    assert DiscoveryRules().trust.mode is TrustMode.RESOURCE_MANAGER


def test_a_self_declared_ps_is_not_believed_and_says_why() -> None:
    result = judge(CLAIM_PS)
    assert result.identity is None and result.untrusted
    assert result.problem is not None
    assert "not trusted: job mine (env, uid 1000) is self-declared" in result.problem
    assert 'trust = "any"' in result.problem  # the way out, for single-tenant hosts
    believed = judge(CLAIM_PS, DiscoveryRules(trust=TRUST_ANY)).identity
    assert believed is not None and (believed.job, believed.role) == ("mine", "ps")


def test_a_slurm_task_is_believed_for_its_own_job_only() -> None:
    rules = DiscoveryRules(slurm_ps_procids=frozenset({0}))
    task = {"SLURM_JOB_ID": "812", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0"}
    for cgroup in (V1_TASK, V2_TASK):
        found = judge(task, rules, cgroup=cgroup).identity
        assert found is not None and (found.job, found.role) == ("slurm/812", "ps")
        # A framework's own identity inside the job is renamed to the Slurm job: believed.
        tf = {"TF_CONFIG": json.dumps({"cluster": {"ps": ["a:1"]}, "task": {"type": "ps"}})}
        assert judge(tf, cgroup=cgroup).identity is not None
        # Claiming another job from inside job 812: by variable, by TENSORLIGHTS_JOB.
        for env in ({**task, "SLURM_JOB_ID": "7"}, {**task, "TENSORLIGHTS_JOB": "other"}):
            refused = judge(env, rules, cgroup=cgroup)
            assert refused.identity is None and refused.untrusted
            assert "runs in Slurm job 812's cgroup" in (refused.problem or "")


def test_a_slurm_task_must_run_as_the_user_its_cgroup_names() -> None:
    refused = judge(CLAIM_PS | {"SLURM_JOB_ID": "812", "TENSORLIGHTS_JOB": ""}, uid=1001,
                    cgroup=V1_TASK)  # fmt: skip
    assert refused.identity is None
    assert "(env, uid 1001) runs in the cgroup of uid 1000's Slurm job 812" in (
        refused.problem or ""
    )


def test_slurm_variables_without_the_cgroup_are_only_a_claim() -> None:
    result = judge({"SLURM_JOB_ID": "812", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0"})
    assert result.identity is None and result.untrusted


def test_trusted_users_are_believed_whatever_they_claim() -> None:
    rules = DiscoveryRules(trust=Trust(TrustMode.RESOURCE_MANAGER, frozenset({1000})))
    assert judge(CLAIM_PS, rules).identity is not None
    assert judge(CLAIM_PS, rules, uid=1001).identity is None


def test_a_malformed_claim_stays_a_plain_problem_not_a_trust_one() -> None:
    result = judge({"TENSORLIGHTS_JOB": "bad\x1bjob", "TENSORLIGHTS_ROLE": "ps"})
    assert result.identity is None and not result.untrusted


NAMES = [
    *("TENSORLIGHTS_JOB", "TENSORLIGHTS_ROLE", "TF_CONFIG", "DMLC_ROLE", "DMLC_PS_ROOT_URI"),
    *("DMLC_PS_ROOT_PORT", "TORCHELASTIC_RUN_ID", "ROLE_NAME", "RANK", "MASTER_ADDR"),
    *("MASTER_PORT", "SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_PROCID"),
]
POD = "2f0c6b9e-1f4a-4c1e-9c7e-3b1d2a4e5f60"
POD_CGROUPS = (
    f"0::/kubepods/burstable/pod{POD}/0123abcd\n",  # cgroupfs driver
    f"4:memory:/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod"
    f"{POD.replace('-', '_')}.slice/cri-containerd-0123abcd.scope\n",  # systemd driver
    f"0::/kubepods/pod{POD}/0123abcd\n",  # guaranteed QoS
)
TF_PS = {"TF_CONFIG": json.dumps({"cluster": {"ps": ["a:1"]}, "task": {"type": "ps"}})}


def with_vouchers(*vouchers: JobVoucher) -> DiscoveryRules:
    return DiscoveryRules(trust=Trust(vouchers=vouchers))


def test_pod_cgroups_name_their_pod() -> None:
    assert all(pod_uid(cgroup) == POD for cgroup in POD_CGROUPS)
    assert pod_uid("0::/system.slice/docker-0123.scope\n") is None
    assert pod_uid(f"0::/user.slice/pod{POD}/x\n") is None  # not under kubepods


def test_a_pod_the_controller_knows_vouches_for_its_job_and_user_only() -> None:
    job = judge(TF_PS, DiscoveryRules(trust=TRUST_ANY)).identity
    assert job is not None
    rules = with_vouchers(JobVoucher(job.job, VoucherSource.KUBERNETES, pods=((POD, 1000),)))
    for cgroup in POD_CGROUPS:
        believed = judge(TF_PS, rules, cgroup=cgroup).identity
        assert believed is not None and believed.job == job.job
        other_job = judge(CLAIM_PS, rules, cgroup=cgroup)
        assert f"runs in pod {POD} of job {job.job}" in (other_job.problem or "")
        other_user = judge(TF_PS, rules, cgroup=cgroup, uid=0)
        assert f"pod {POD} runs as uid 1000" in (other_user.problem or "")
        unknown = judge(TF_PS, with_vouchers(), cgroup=cgroup)
        assert "not a pod of any job the controller knows" in (unknown.problem or "")


def test_the_controllers_slurm_user_must_match_where_the_cgroup_names_none() -> None:
    env = {"SLURM_JOB_ID": "812", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0"}
    rules = DiscoveryRules(slurm_ps_procids=frozenset({0}))
    for uid, believed in ((1000, True), (1001, False), (NO_SUCH_USER, False)):
        voucher = JobVoucher("slurm/812", VoucherSource.SLURM, "alice", uid)
        vouched = replace(rules, trust=Trust(vouchers=(voucher,)))
        result = judge(env, vouched, cgroup=V2_TASK, uid=1000)
        assert (result.identity is not None) is believed
        if not believed:
            assert "Slurm runs the job as alice" in (result.problem or "")


def test_a_jobs_file_entry_with_a_user_vouches_for_that_users_claims() -> None:
    rules = with_vouchers(JobVoucher("mine", VoucherSource.STATIC, "alice", 1000))
    assert judge(CLAIM_PS, rules, uid=1000).identity is not None
    refused = judge(CLAIM_PS, rules, uid=1001)
    assert "the jobs file gives the job to alice" in (refused.problem or "")
    # A Slurm job's user alone vouches for nothing outside the job's cgroup.
    slurm = with_vouchers(JobVoucher("slurm/5", VoucherSource.SLURM, "alice", 1000))
    assert judge({"SLURM_JOB_ID": "5", "TENSORLIGHTS_ROLE": "ps"}, slurm).identity is None


LAUNCHER_VARIABLES = st.dictionaries(
    st.sampled_from(NAMES),
    st.sampled_from(["ps", "server", "0", "1", "9000", "job-a", "x", "slurm/5", "{}"]),
)


@given(env=LAUNCHER_VARIABLES, uid=st.integers(0, 70000))
def test_outside_a_slurm_job_no_environment_earns_an_identity(
    env: dict[str, str], uid: int
) -> None:
    assert judge(env, DiscoveryRules(slurm_ps_procids=frozenset({0})), uid=uid).identity is None


@given(env=LAUNCHER_VARIABLES)
def test_inside_a_slurm_job_no_environment_names_another_job(env: dict[str, str]) -> None:
    found = judge(env, DiscoveryRules(slurm_ps_procids=frozenset({0})), cgroup=V1_TASK).identity
    assert found is None or found.job == "slurm/812"


def test_the_slurm_plugins_record_names_the_ps_tasks_with_no_agent_configuration() -> None:
    """`srun --tensorlights-ps-tasks=0,2`: slurmstepd (root) recorded the step's PS tasks."""

    def declared(procid: str, extra: Mapping[str, str] = {}) -> Verdict:
        env = {"SLURM_JOB_ID": "812", "SLURM_STEP_ID": "0", "SLURM_PROCID": procid, **extra}
        facts = ProcessFacts(1, "python", "python3", ("python",), env, V1_TASK, 1000)
        return identify(replace(facts, declared_ps_tasks=frozenset({0, 2})), STRICT)

    for procid, role in (("0", "ps"), ("1", "task"), ("2", "ps"), ("3", "task")):
        found = declared(procid).identity
        assert found is not None and (found.job, found.role, found.source) == (
            "slurm/812",
            role,
            "slurm_spank",
        )
    # The record beats a framework's own roles: a torchrun worker listed is the PS, and a
    # rank the framework would make PS but the user did not list is not.
    torch = {"MASTER_ADDR": "n1", "MASTER_PORT": "29500", "RANK": "0", "ROLE_NAME": "ps"}
    found = declared("1", torch).identity
    assert found is not None and found.role == "task"
    found = declared("2", {**torch, "ROLE_NAME": "trainer"}).identity
    assert found is not None and found.role == "ps"
    # The explicit opt-in still wins (as it does over every launcher).
    found = declared("0", {"TENSORLIGHTS_ROLE": "worker"}).identity
    assert found is not None and found.role == "worker"
    # A task whose SLURM_PROCID is missing cannot be matched: said, never silently a PS.
    missing = declared("")
    assert missing.problem is not None and "has no SLURM_PROCID" in missing.problem
