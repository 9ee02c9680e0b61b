"""DSCP marks proved on the wire: sniffed with scapy in the receiving namespace, and enforced
by a receiver that drops PS packets lacking the green light's DSCP."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

from tensorlights.policy.dscp_plan import DEFAULT_BAND_DSCP
from tensorlights.testbed import netns, traffic
from tensorlights.testbed.socket_holder import clean_env

from ..functional.tcutil import sink_result, start_sink
from .agentproc import AgentProcess
from .test_agent import tf_config

pytestmark = pytest.mark.root

GREEN, NEXT = DEFAULT_BAND_DSCP[0], DEFAULT_BAND_DSCP[1]
PLAIN_PORT = 5003


@pytest.fixture
def servers(pair: netns.HostPair) -> Iterator[dict[int, subprocess.Popen[str]]]:
    """PS jobs on 5001 and 5002 (TF_CONFIG), and a plain server on 5003 (no launcher)."""
    started = {
        5001: traffic.start_server(pair.a.ns, [5001], env=clean_env({"TF_CONFIG": tf_config("a")})),
        5002: traffic.start_server(pair.a.ns, [5002], env=clean_env({"TF_CONFIG": tf_config("b")})),
        PLAIN_PORT: traffic.start_server(pair.a.ns, [PLAIN_PORT], env=clean_env()),
    }
    try:
        yield started
    finally:
        for server in started.values():
            server.kill()
            server.wait()


def sniff(pair: netns.HostPair, seconds: float) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "tensorlights.testbed.sniff", "--iface", "veth-b"]
    proc = subprocess.Popen(
        pair.b.exec_args(*command, "--seconds", str(seconds)), stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def test_marks_follow_the_green_light_and_other_traffic_keeps_dscp_0(
    pair: netns.HostPair,
    servers: dict[int, subprocess.Popen[str]],
    agents: list[AgentProcess],
    tmp_path: Path,
) -> None:
    # 20 Mbit keeps the packet rate within what scapy dissects on two cores.
    agent = AgentProcess(pair, tmp_path, "--interval", "1s", "--link-rate", "20mbit")
    agents.append(agent)
    document = agent.wait_status(lambda d: len(d.get("bands", {})) == 2)
    assert set(document["dscp"].values()) == {GREEN, NEXT}

    capture = sniff(pair, seconds=5.0)
    targets = [f"{pair.a.ipv4}:{port}" for port in (5001, 5002, PLAIN_PORT)]
    sink = start_sink(targets, 4.5, 0.5, pair)
    sink_result(sink, timeout=20)
    out, _ = capture.communicate(timeout=30)
    rows = json.loads(out)["counts"]

    by_port: dict[int, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    by_slot: dict[int, dict[int, dict[int, int]]] = defaultdict(lambda: defaultdict(dict))
    for slot, sport, dscp, packets in rows:
        by_port[sport][dscp] += packets
        by_slot[slot][sport][dscp] = packets
    assert set(by_port[PLAIN_PORT]) == {0} and sum(by_port[PLAIN_PORT].values()) > 20
    for port in (5001, 5002):
        assert set(by_port[port]) == {GREEN, NEXT}, by_port  # marked, and the mark moved
    # In each slot, the PS port that carried most packets (the green job under strict
    # priority) carried the green mark: the marks agree with the tc bands.
    agree = disagree = 0
    for ports in by_slot.values():
        totals = {p: sum(ports.get(p, {}).values()) for p in (5001, 5002)}
        top = max(totals, key=lambda p: totals[p])
        if totals[top] < 10 or len(ports[top]) != 1:
            continue  # too few packets, or the light moved within this slot
        if next(iter(ports[top])) == GREEN:
            agree += 1
        else:
            disagree += 1
    assert agree >= 20 and disagree <= agree // 5, (agree, disagree)


def test_receiver_dropping_unmarked_packets_still_gets_the_green_jobs_data(
    pair: netns.HostPair, agents: list[AgentProcess], tmp_path: Path
) -> None:
    ps = traffic.start_server(pair.a.ns, [5001], env=clean_env({"TF_CONFIG": tf_config("a")}))
    plain = traffic.start_server(pair.a.ns, [PLAIN_PORT], env=clean_env())
    try:
        agent = AgentProcess(pair, tmp_path, "--policy", "static")
        agents.append(agent)
        agent.wait_status(lambda d: len(d.get("bands", {})) == 1)
        rules = (
            "table inet rx {\n  chain in {\n    type filter hook input priority 0; policy accept;\n"
            f"    ip saddr {pair.a.ipv4} tcp sport {{ 5001, {PLAIN_PORT} }}"
            f" ip dscp != {GREEN} drop\n"
            "  }\n}"
        )
        (tmp_path / "rx.nft").write_text(rules + "\n")
        netns.run(["ip", "netns", "exec", pair.b.ns, "nft", "-f", str(tmp_path / "rx.nft")])
        sink = start_sink([f"{pair.a.ipv4}:5001"], 3.0, 0.5, pair)
        result = sink_result(sink, timeout=20)
        received = sum(result["flows"][f"{pair.a.ipv4}:5001"])
        assert received >= 0.8 * 200_000_000 / 8 * 3.0  # the green job's data all got through
        # Control: the same rule drops the unmarked plain server's packets, even its SYN-ACK.
        probe = subprocess.run(
            pair.b.exec_args(
                sys.executable,
                "-c",
                "import socket,sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), 2)",
                pair.a.ipv4,
                str(PLAIN_PORT),
            ),
            capture_output=True,
            text=True,
        )
        assert probe.returncode != 0 and "timed out" in probe.stderr
    finally:
        for server in (ps, plain):
            server.kill()
            server.wait()
