"""Trust through the controller (issue 19, item 5): an agent under the default trust believes
a process in a Kubernetes pod only while the controller's Kubernetes source knows that pod as
a pod of the claimed job. The API server is our emulator, run in the controller's namespace;
the pods' cgroups are our own, shaped as the kubelet makes them."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tensorlights.testbed import netns
from tensorlights.testbed.kube_emulator import kubeflow_pod
from tensorlights.testbed.processes import stop
from tensorlights.testbed.psjob import tf_job_id, tf_launcher_env
from tensorlights.testbed.socket_holder import Holder, clean_env, start_holder

from ..functional.holders import in_cgroup, own_cgroup
from .agentproc import AgentProcess
from .controllerproc import ControllerProcess, agent_config, make_pki

pytestmark = pytest.mark.root


def refused(document: dict[str, Any], holder: Holder, why: str) -> bool:
    return any(
        p.startswith(f"pid {holder.pid} ") and why in p for p in document["discovery"]["problems"]
    )


def test_a_pod_is_believed_while_the_controller_knows_it(
    pair: netns.HostPair, tmp_path: Path
) -> None:
    pki = make_pki(tmp_path / "pki", [pair.b.ipv4], ["ps1"])
    env = tf_launcher_env("trust", 2)
    job = tf_job_id("trust", 2)
    pod = kubeflow_pod("ml", "bert", "PS", 0, "ps1", env, run_as_user=0)
    pods_file = tmp_path / "pods.json"
    pods_file.write_text(json.dumps([pod]))
    (tmp_path / "ctl").mkdir()
    (tmp_path / "ps1").mkdir()
    agent_config(tmp_path / "ps1" / "agent.toml", f"{pair.b.ipv4}:9740", pki, "ps1")
    with contextlib.ExitStack() as stack:
        url = stack.enter_context(kube_emulator(pair.b, pods_file))
        (tmp_path / "ctl" / "kube.toml").write_text(
            f'[sources.kubernetes]\nurl = "{url}"\ninterval = "500ms"\n'
        )
        controller = ControllerProcess(
            pair.b, tmp_path / "ctl", pki, "--config", str(tmp_path / "ctl" / "kube.toml"),
            listen=f"{pair.b.ipv4}:9740",
        )  # fmt: skip
        stack.callback(controller.stop)
        agent = AgentProcess(pair, tmp_path / "ps1", standalone=False, trust="resource-manager")
        stack.callback(agent.stop)
        pod_uid = pod["metadata"]["uid"]
        known = stack.enter_context(own_cgroup(f"kubepods/burstable/pod{pod_uid}/c"))
        stranger = stack.enter_context(own_cgroup(f"kubepods/burstable/pod{uuid.uuid4()}/c"))
        in_ns = pair.a.exec_args()
        ps = start_holder(env, "--host", pair.a.ipv4, prefix=[*in_cgroup(known), *in_ns])
        stack.callback(ps.stop)
        # The same claim from a pod the controller does not know (another tenant's).
        rival = start_holder(env, "--host", pair.a.ipv4, prefix=[*in_cgroup(stranger), *in_ns])
        stack.callback(rival.stop)

        unknown_pod = "which is not a pod of any job the controller knows on this host"
        document = agent.wait_status(
            lambda d: d.get("order") == [job] and refused(d, rival, unknown_pod)
        )
        (task,) = [t for t in document["discovery"]["tasks"] if t["job"] == job]
        assert task["pid"] == ps.pid  # the rival's sockets are not the job's
        assert job in document["bands"]
        # What the controller vouches for, and what is not believed, shown to the operator.
        vouchers = document["discovery"]["vouchers"]
        assert vouchers == [{"job": job, "source": "kubernetes", "user": "", "pods": [pod_uid]}]
        cli = [sys.executable, "-m", "tensorlights.cli.agent", "status", "--socket", agent.socket]
        shown = subprocess.run(
            [str(arg) for arg in cli],
            capture_output=True,
            text=True,
            check=True,
            env=clean_env({"COLUMNS": "300"}),  # one line per warning
        ).stdout
        assert f"the controller vouches for {job} (kubernetes: 1 pods)" in shown
        assert f"warning: pid {rival.pid} " in shown and "not trusted" in shown
        controller.wait(
            lambda: any(
                j["job"] == job and j["sources"] == ["agent", "kubernetes"]
                for j in controller.query("jobs")
            ),
            what="the job from the agent and from Kubernetes",
        )

        # The pod is deleted: the controller stops vouching, and the agent stops believing.
        pods_file.write_text("[]")
        document = agent.wait_status(lambda d: refused(d, ps, unknown_pod) and not d["bands"])
        assert document["discovery"]["tasks"] == []


@contextlib.contextmanager
def kube_emulator(host: netns.Host, pods_file: Path) -> Iterator[str]:
    """Our API server emulator in `host`'s namespace, serving `pods_file`; its URL."""
    emulator = subprocess.Popen(
        host.exec_args(
            sys.executable, "-m", "tensorlights.testbed.kube_emulator",
            "--listen", f"{host.ipv4}:0", "--pods", str(pods_file),
        ),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=clean_env(),
    )  # fmt: skip
    assert emulator.stdin is not None and emulator.stdout is not None
    try:
        url = emulator.stdout.readline().strip()
        assert url.startswith("http://"), f"the emulator did not start ({emulator.poll()})"
        yield url
    finally:
        emulator.stdin.close()  # its signal to stop; `stop` makes sure
        stop(emulator)
