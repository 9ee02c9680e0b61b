"""Membership from a real Slurm: a multi-task job with a PS task and worker tasks on two
nodes; the controller reports the job, its nodes (Slurm) and its PS host (the agent there).
The agent runs with the default trust: the Slurm task is believed because Slurm put it in its
job's cgroup, while a process beside it that only names itself a PS is not (issue 19, item 5)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tensorlights.testbed import netns
from tensorlights.testbed.slurm import slurm_cluster
from tensorlights.testbed.socket_holder import clean_env, start_holder

from ..functional.slurmtasks import CONNECTED_TASK, SLURM_TESTS
from .agentproc import AgentProcess, metric
from .controllerproc import ControllerProcess, agent_config, make_pki

pytestmark = SLURM_TESTS


def test_controller_reports_a_slurm_job_with_its_nodes_and_ps_host(
    pair: netns.HostPair, tmp_path: Path
) -> None:
    pki = make_pki(tmp_path / "pki", [pair.b.ipv4], ["n1"])
    with slurm_cluster(["n1", "n2"]) as slurm:
        if not slurm.cgroups:
            pytest.skip("no cgroup v1 freezer: Slurm cannot put tasks in job cgroups here")
        # Task 0 (the PS) runs in the namespace of the agent of node n1; the workers do not.
        script = tmp_path / "task.sh"
        script.write_text(
            "#!/bin/sh\n"
            f'if [ "$SLURM_PROCID" = 0 ]; then exec ip netns exec {pair.a.ns} '
            f'{sys.executable} -c "{CONNECTED_TASK}"; fi\n'
            f'exec {sys.executable} -c "{CONNECTED_TASK}"\n'
        )
        script.chmod(0o755)
        out = slurm.command("sbatch", "-N2", "-n4", "-J", "ps-job", "--wrap", f"srun {script}")
        slurm_id = int(out.stdout.split()[-1])
        job = f"slurm/{slurm_id}"
        # The controller lives in the other namespace and asks Slurm through our own.
        (tmp_path / "ctl").mkdir()
        squeue = ["nsenter", f"--net=/proc/{os.getpid()}/ns/net", "squeue", "--json"]
        (tmp_path / "ctl" / "extra.toml").write_text(
            f'[sources.slurm]\nenabled = true\ninterval = "500ms"\ncommand = {squeue!r}\n'.replace(
                "'", '"'
            )
        )
        controller = ControllerProcess(
            pair.b, tmp_path / "ctl", pki, "--config", str(tmp_path / "ctl" / "extra.toml"),
            listen=f"{pair.b.ipv4}:9740", env=clean_env({"SLURM_CONF": str(slurm.conf)}),
        )  # fmt: skip
        (tmp_path / "n1").mkdir()
        agent_config(
            tmp_path / "n1" / "agent.toml", f"{pair.b.ipv4}:9740", pki, "n1",
            extra="[discovery]\nslurm_ps_procids = [0]\n",
        )  # fmt: skip
        agent = AgentProcess(pair, tmp_path / "n1", standalone=False, trust="resource-manager")
        # Beside the Slurm job on the agent's host: a process that claims to be a PS.
        hostile = start_holder(
            {"TENSORLIGHTS_JOB": "grab", "TENSORLIGHTS_ROLE": "ps"},
            "--host", pair.a.ipv4, prefix=pair.a.exec_args(),
        )  # fmt: skip
        try:

            def reported() -> bool:
                # Both sources: the agent's report and Slurm's poll (squeue, every 500 ms, can
                # come later than the agent on a loaded machine).
                jobs = {j["job"]: j for j in controller.query("jobs")}
                return (
                    job in jobs
                    and jobs[job]["ps_hosts"] == ["n1"]
                    and "slurm" in jobs[job]["sources"]
                )

            controller.wait(reported, deadline_s=40, what="the Slurm job with its PS host")
            (found,) = [j for j in controller.query("jobs") if j["job"] == job]
            assert found["sources"] == ["agent", "slurm"]
            assert found["nodes"] == ["n1", "n2"]
            assert found["name"] == "ps-job" and found["state"] == "RUNNING"
            assert found["user"] == "root"
            (host,) = controller.query("hosts")
            assert host["host"] == "n1" and host["connected"] and host["jobs"] == [job]

            def refused(problems: list[str]) -> bool:
                return any(
                    f"pid {hostile.pid} " in p and "not trusted: job grab (env, uid 0)" in p
                    for p in problems
                )

            status = agent.wait_status(
                lambda d: (
                    d.get("mode") == "plan"
                    and d.get("order") == [job]
                    and refused(d["discovery"]["problems"])
                )
            )
            # The claim is not believed: no band, not reported, listed as a problem, counted.
            assert "grab" not in status["bands"]
            assert all(j["job"] != "grab" for j in controller.query("jobs"))
            _, metrics = agent.http("/metrics")
            assert metric(metrics, "tensorlights_untrusted_processes") == 1
        finally:
            hostile.stop()
            agent.stop()
            controller.stop()
            slurm.command("scancel", str(slurm_id), check=False)
