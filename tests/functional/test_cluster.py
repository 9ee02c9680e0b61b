"""The emulated cluster: hosts reach each other through the bridge namespace, and the cluster
is removed even when its runner is killed."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tensorlights.testbed import netns
from tensorlights.testbed.cluster import cluster
from tensorlights.testbed.netns import leftover_namespaces as cluster_namespaces
from tensorlights.testbed.socket_holder import start_holder

pytestmark = pytest.mark.root


def test_hosts_reach_each_other_over_ipv4_and_ipv6_and_everything_goes_away() -> None:
    with cluster(["ps0", "w0", "w1"]) as c:
        assert len(cluster_namespaces(c.run_id)) == 4  # 3 hosts + the bridge
        ps = c.hosts["ps0"]
        for address in (ps.ipv4, ps.ipv6):
            listener = start_holder({}, "--host", address, prefix=ps.exec_args())
            try:
                port = listener.report["listen_port"]
                for worker in ("w0", "w1"):
                    host = c.hosts[worker]
                    target = f"[{address}]:{port}" if ":" in address else f"{address}:{port}"
                    client = start_holder(
                        {}, "--host", host.ipv4 if "." in address else host.ipv6,
                        "--connect", target, prefix=host.exec_args(),
                    )  # fmt: skip
                    client.stop()
            finally:
                listener.stop()
        routes = netns.run(ps.exec_args("ip", "route", "show")).stdout
        assert "congctl cubic" in routes
        run_id = c.run_id
    assert cluster_namespaces(run_id) == []


RUNNER = """
import sys, time
from tensorlights.testbed.cluster import create_cluster
c = create_cluster(["a", "b"])
print(c.run_id, flush=True)
time.sleep(600)
"""


def test_a_killed_runner_leaves_nothing_behind() -> None:
    runner = subprocess.Popen([sys.executable, "-c", RUNNER], stdout=subprocess.PIPE, text=True)
    assert runner.stdout is not None
    run_id = runner.stdout.readline().strip()
    assert len(cluster_namespaces(run_id)) == 3
    runner.kill()  # SIGKILL: no finally, no atexit
    runner.wait()
    deadline = time.monotonic() + 20
    while cluster_namespaces(run_id) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert cluster_namespaces(run_id) == []


PAIR_RUNNER = """
import time
from tensorlights.testbed.netns import create_pair
print(create_pair().run_id, flush=True)
time.sleep(600)
"""


def test_a_host_pair_of_a_terminated_runner_is_removed_too() -> None:
    """pytest stopped by SIGTERM runs no fixture teardown: the pair's reaper removes it."""
    runner = subprocess.Popen(
        [sys.executable, "-c", PAIR_RUNNER], stdout=subprocess.PIPE, text=True
    )
    assert runner.stdout is not None
    run_id = runner.stdout.readline().strip()
    assert len(cluster_namespaces(run_id)) == 2
    runner.terminate()
    runner.wait()
    deadline = time.monotonic() + 20
    while cluster_namespaces(run_id) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert cluster_namespaces(run_id) == []
