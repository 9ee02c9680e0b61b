"""The controller's leader election against a real etcd cluster (3 members on loopback)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tensorlights.controller.election import STEP_DOWN_SHARE, Election
from tensorlights.controller.etcd import EtcdClient, EtcdError, EtcdUnavailable
from tensorlights.testbed.etcd import EtcdCluster

TTL_S = 2


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    with EtcdCluster(tmp_path_factory.mktemp("etcd"), members=3) as cluster:
        yield cluster


def election(etcd: EtcdCluster, address: str, prefix: str) -> Election:
    return Election(EtcdClient(etcd.endpoints), address, TTL_S, prefix=prefix)


def test_one_replica_wins_and_each_leader_has_a_higher_incarnation(
    etcd: EtcdCluster, request: pytest.FixtureRequest
) -> None:
    prefix = f"/t/{request.node.name}"
    a, b = election(etcd, "a:1", prefix), election(etcd, "b:1", prefix)
    term_a = a.campaign()
    assert term_a is not None
    assert b.campaign() is None and b.known_leader == "a:1"
    a.resign(term_a)
    term_b = b.campaign()
    assert term_b is not None and term_b.incarnation > term_a.incarnation
    assert a.leader() == "b:1"
    # Even with a clock far behind, the next leader's incarnation is above the last one.
    behind = Election(EtcdClient(etcd.endpoints), "c:1", TTL_S, prefix, wall_ns=lambda: 5)
    b.resign(term_b)
    term_c = behind.campaign()
    assert term_c is not None and term_c.incarnation == term_b.incarnation + 1


def test_a_leader_that_stops_renewing_is_replaced_after_its_lease(
    etcd: EtcdCluster, request: pytest.FixtureRequest
) -> None:
    prefix = f"/t/{request.node.name}"
    a, b = election(etcd, "a:1", prefix), election(etcd, "b:1", prefix)
    term = a.campaign()
    assert term is not None
    for _ in range(3):  # renewals keep it
        time.sleep(a.renew_every_s)
        renewed = a.renew(term)
        assert renewed is not None and renewed.valid_until > term.valid_until
        term = renewed
        assert b.campaign() is None
    stopped = time.monotonic()  # a stops renewing (a SIGKILL)
    while (won := b.campaign()) is None:
        assert time.monotonic() - stopped < TTL_S + 2, "no new leader after the TTL"
        time.sleep(0.1)
    took = time.monotonic() - stopped
    # a stepped down (by its own reckoning) before etcd could let b win.
    assert a.step_down_at(term) <= stopped + took
    assert won.incarnation > term.incarnation
    assert a.renew(term) is None  # a's lease is gone: it must not lead


def test_the_election_survives_one_member_down_and_stops_without_a_quorum(
    tmp_path: Path,
) -> None:
    with EtcdCluster(tmp_path, members=3) as etcd:
        a = Election(EtcdClient(etcd.endpoints, timeout_s=0.5), "a:1", TTL_S)
        term = a.campaign()
        assert term is not None
        etcd.kill_member(0)
        renewed = None
        deadline = time.monotonic() + 5
        while renewed is None:  # answered by another member, once they elected a raft leader
            assert time.monotonic() < deadline, "no renewal with two members of three"
            try:
                renewed = a.renew(term)
            except EtcdUnavailable:
                time.sleep(0.1)
        assert renewed.valid_until > term.valid_until
        etcd.stop_member(1)  # quorum lost
        lost = time.monotonic()
        # The member left, if it was the raft leader, answers keepalives until it notices
        # (check-quorum: an election timeout, 1 s here); then every renewal fails and the
        # term runs out by the leader's own reckoning.
        while True:
            try:
                renewed = a.renew(renewed) or renewed
            except EtcdUnavailable:
                break
            assert time.monotonic() - lost < 2.5, "renewals went on without a quorum"
        failing = time.monotonic()
        while time.monotonic() < a.step_down_at(renewed):
            with pytest.raises(EtcdUnavailable):
                a.renew(renewed)
        assert time.monotonic() - failing <= (1 - STEP_DOWN_SHARE) * TTL_S + 1.0
        etcd.start_member(1)
        etcd.start_member(0)
        deadline = time.monotonic() + 15
        while True:  # the old lease expires in etcd, then a new term
            try:
                term = a.campaign()
            except EtcdUnavailable:
                term = None
            if term is not None:
                break
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert term.incarnation > renewed.incarnation


def test_requests_etcd_refuses_are_errors_not_outages(etcd: EtcdCluster) -> None:
    client = EtcdClient(etcd.endpoints)
    with pytest.raises(EtcdError) as refused:
        client.revoke(12345)  # no such lease
    assert not isinstance(refused.value, EtcdUnavailable)
    assert client.keepalive(12345) == 0
    with pytest.raises(EtcdUnavailable, match="no endpoint answered"):
        EtcdClient(["http://127.0.0.1:9"], timeout_s=0.2).get(b"/x")
