"""Controller replicas: the [ha] settings, and a replica's core as it leads and follows."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from tensorlights.controller.config import build_config
from tensorlights.controller.core import Controller, NotLeader
from tensorlights.controller.metrics import ControllerMetrics
from tensorlights.controller.planner import ClusterPolicy, Planner
from tensorlights.controller.registry import Registry, UnknownSession
from tensorlights.errors import ConfigError
from tensorlights.model import HostReport, Mode, Registration, ReportedJob


def _tls(tmp_path: Path) -> dict[str, str]:
    for name in ("ca", "cert", "key"):
        (tmp_path / name).write_text("x")
    return {name: str(tmp_path / name) for name in ("ca", "cert", "key")}


@pytest.mark.parametrize(
    ("ha", "message"),
    [
        ({"etcd": ["http://e1:2379"]}, "ha.etcd needs ha.advertise"),
        ({"etcd": ["e1:2379"], "advertise": "c1:9740"}, "not an http:// or https:// URL"),
        ({"etcd": "http://e1:2379", "advertise": "c1"}, "must be HOST:PORT"),
        ({"etcd": ["http://e1:2379"], "advertise": "c1:9740", "ttl": "7s"}, "at most"),
    ],
)
def test_ha_settings_are_checked(ha: dict[str, Any], message: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=message):
        build_config({"tls": _tls(tmp_path), "ha": ha}, {})


def test_ha_endpoints_come_as_a_list_or_with_commas(tmp_path: Path) -> None:
    listed = build_config(
        {"tls": _tls(tmp_path), "ha": {"etcd": ["http://a:1", "http://b:1"], "advertise": "c:9"}},
        {},
    )
    flagged = build_config(
        {"tls": _tls(tmp_path)}, {"ha.etcd": "http://a:1, http://b:1", "ha.advertise": "c:9"}
    )
    assert listed.etcd == flagged.etcd == ("http://a:1", "http://b:1")
    assert build_config({"tls": _tls(tmp_path)}, {}).etcd == ()  # one controller: no etcd


def test_a_follower_refuses_agents_and_a_new_term_starts_from_nothing() -> None:
    async def scenario() -> None:
        registry = CollectorRegistry()
        metrics = ControllerMetrics(registry)
        controller = Controller(Registry(), Planner(3.0, 15.0, 1, ClusterPolicy.PACK), metrics, 1.0)
        registration = Registration("h1", 10, "t", (("eth0", 10**9),), "pack")
        record = controller.register(registration)  # one replica alone: it leads
        job = ReportedJob("j", frozenset({1}), 1, 1)
        controller.report(HostReport(record.session, 1, (job,), (), Mode.PLAN, ""))
        stream = controller.stream_opened(record)

        controller.follow("c2:9740")
        assert stream.is_set(), "plan streams are woken to end"
        assert not controller.current(record)
        with pytest.raises(NotLeader, match="the leader is at c2:9740") as refused:
            controller.register(registration)
        assert refused.value.leader == "c2:9740"
        with pytest.raises(UnknownSession):
            controller.report(HostReport(record.session, 2, (job,), (), Mode.PLAN, ""))
        assert registry.get_sample_value("tensorlights_controller_leader") == 0
        controller.follow(None)
        with pytest.raises(NotLeader, match="no leader is elected"):
            controller.register(registration)

        controller.lead(Planner(3.0, 15.0, 7, ClusterPolicy.PACK), "c1:9740")
        again = controller.register(registration)
        assert again.session != record.session
        assert controller.planner.incarnation == 7
        assert controller.plan_for("h1").incarnation == 7
        assert registry.get_sample_value("tensorlights_controller_leader") == 1
        assert registry.get_sample_value("tensorlights_controller_leader_terms_total") == 1

    asyncio.run(scenario())


def test_news_is_what_the_plan_depends_on_not_telemetry_noise() -> None:
    from tensorlights.model import jobs_moved

    job = ReportedJob("j", frozenset({1}), 1, 1, spread_s=0.01, period_s=0.3, demand=0.5)
    same = ReportedJob("j", frozenset({1}), 1, 1, spread_s=0.02, period_s=0.31, demand=0.53)
    assert not jobs_moved((job,), (same,))
    starving = ReportedJob("j", frozenset({1}), 1, 1, period_s=0.3, demand=0.5, lag_s=30.0)
    assert not jobs_moved((starving,), (replace(starving, lag_s=31.0),))  # how far: not news
    declared = replace(job, remaining_s=12.0)
    assert not jobs_moved((declared,), (replace(declared, remaining_s=11.5),))  # noise
    assert jobs_moved((declared,), (replace(declared, remaining_s=9.0),))  # may reorder
    for news in (
        (),  # gone
        (job, ReportedJob("k", frozenset({2}), 1, 1)),  # new
        (ReportedJob("j", frozenset({1, 3}), 1, 2, period_s=0.3, demand=0.5),),  # ports
        (ReportedJob("j", frozenset({1}), 1, 1, period_s=0.3, demand=0.7),),  # demand
        (ReportedJob("j", frozenset({1}), 1, 1, demand=0.5),),  # no longer iterating
        (ReportedJob("j", frozenset({1}), 1, 1, period_s=0.3),),  # demand no longer trusted
        (ReportedJob("j", frozenset({1}), 1, 1, period_s=0.3, demand=0.5, lag_s=30.0),),
        (replace(job, remaining_s=12.0),),  # its length declared, now measured
    ):
        assert jobs_moved((job,), news), news
