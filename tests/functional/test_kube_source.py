"""The Kubernetes membership source over real HTTP against the API emulator (there is no
installable API server here; see tensorlights/testbed/kube_emulator.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tensorlights.controller.sources import KubernetesPods
from tensorlights.errors import TransientError
from tensorlights.testbed.kube_emulator import KubeEmulator, kubeflow_pod


def test_pods_are_read_with_the_token_and_namespace(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    with KubeEmulator(token="s3cret") as api:
        api.pods = [
            kubeflow_pod("ml", "bert", "PS", 0, "gpu1"),
            kubeflow_pod("ml", "bert", "PS", 1, "gpu2"),
            kubeflow_pod("ml", "bert", "Worker", 0, "gpu3"),
            kubeflow_pod("other", "gpt", "PS", 0, "gpu9"),
        ]
        (job,) = KubernetesPods(api.url, "ml", token_file=token).jobs()
        assert job.job == "k8s/ml/bert" and job.ps_hosts == frozenset({"gpu1", "gpu2"})
        assert job.nodes == ("gpu1", "gpu2", "gpu3") and job.source == "kubernetes"
        assert len(KubernetesPods(api.url, token_file=token).jobs()) == 2
        with pytest.raises(TransientError, match="401"):
            KubernetesPods(api.url).jobs()
    with pytest.raises(TransientError):
        KubernetesPods(api.url, timeout_s=1).jobs()  # the server is gone
