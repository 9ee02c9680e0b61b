"""The Kubernetes membership source over real HTTP against the API emulator (there is no
installable API server here; see tensorlights/testbed/kube_emulator.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tensorlights.controller.kubernetes import KubernetesPods
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


def _until(what: str, done: Callable[[], bool], deadline_s: float = 10.0) -> None:
    end = time.monotonic() + deadline_s
    while not done():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.02)


def _names(source: KubernetesPods) -> set[str]:
    return {job.name for job in source.jobs()}


def test_the_watch_keeps_membership_current_and_wakes_the_controller() -> None:
    """After one list, starts, moves and ends of pods arrive as watch events: no relist."""
    with KubeEmulator() as api:
        api.pods = [kubeflow_pod("ml", "bert", "PS", 0, "gpu1")]
        source = KubernetesPods(api.url)
        wakes = threading.Semaphore(0)
        source.subscribe(wakes.release)
        try:
            assert _names(source) == {"ml/bert"}
            api.pods = [*api.pods, kubeflow_pod("ml", "gpt", "PS", 0, "gpu2")]
            assert wakes.acquire(timeout=5)  # the controller is told, not left to poll
            _until("the new job", lambda: _names(source) == {"ml/bert", "ml/gpt"})
            # A pod rescheduled to another node (a MODIFIED event) moves the job.
            api.pods = [kubeflow_pod("ml", "bert", "PS", 0, "gpu7"), api.pods[1]]
            _until("the move", lambda: {j.nodes for j in source.jobs()} == {("gpu7",), ("gpu2",)})
            api.pods = [api.pods[0]]  # DELETED
            _until("the end of ml/gpt", lambda: _names(source) == {"ml/bert"})
            # A pod that is not Running does not count, and Running later does.
            api.pods = [*api.pods, kubeflow_pod("ml", "t5", "PS", 0, "gpu3", phase="Pending")]
            _until("the pending pod's event", lambda: api.store.version >= 6)
            assert _names(source) == {"ml/bert"}
            api.pods = [api.pods[0], kubeflow_pod("ml", "t5", "PS", 0, "gpu3")]
            _until("t5 running", lambda: _names(source) == {"ml/bert", "ml/t5"})
            assert source.relists == 1 and api.watches == 1
        finally:
            source.close()


def test_a_broken_watch_fails_until_a_fresh_list_and_misses_nothing() -> None:
    """A watch whose history is gone (410 Expired) or whose server went away: jobs() says so
    (the controller keeps its last answer), then a new list brings every change made
    meanwhile, deletions included."""
    source: KubernetesPods | None = None
    try:
        with KubeEmulator() as api:
            api.pods = [kubeflow_pod("ml", "bert", "PS", 0, "gpu1")]
            source = KubernetesPods(api.url, timeout_s=2)
            assert _names(source) == {"ml/bert"}
            _until("the watch", lambda: api.watches == 1)
            # The API server restarts with its history forgotten, and bert ends meanwhile:
            # the watch resumes from a version now too old, gets 410 Expired and lists again.
            api.restart([kubeflow_pod("ml", "gpt", "PS", 0, "gpu2")])
            _until("a relist", lambda: source is not None and source.relists >= 2)
            _until("the state after the gap", lambda: _names(source) == {"ml/gpt"})
            assert api.expired == 1  # the resumed watch was refused: its history is gone
            _until("a new watch", lambda: api.watches >= 3)
        # The server is gone: jobs() fails, saying why, instead of answering stale.
        _until("the watch to break", lambda: source is not None and not source.synced)
        with pytest.raises(TransientError, match="listing again"):
            source.jobs()
    finally:
        if source is not None:
            source.close()
