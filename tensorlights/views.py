"""Plain, JSON-ready views of domain objects, shared by the CLIs and the agent's status API."""

from __future__ import annotations

from typing import Any

from tensorlights.model import DiscoverySnapshot, PsTask


def task_view(task: PsTask) -> dict[str, Any]:
    return {
        "job": task.job,
        "kind": task.kind.value,
        "pid": task.pid,
        "create_time": task.create_time,
        "source": task.source,
        "netns": task.netns,
        "in_agent_netns": task.in_agent_netns,
        "listen_ports": sorted(task.listen_ports),
        "connections": [
            {
                "local": f"{c.local_addr}:{c.local_port}",
                "local_port": c.local_port,
                "peer": f"{c.peer_addr}:{c.peer_port}",
            }
            for c in task.connections
        ],
        "peers": list(task.peers),
        "stale": task.stale,
        "rdma": task.rdma,
    }


def snapshot_view(snapshot: DiscoverySnapshot) -> dict[str, Any]:
    return {
        "tasks": [task_view(task) for task in snapshot.tasks],
        "job_ports": {job: sorted(ports) for job, ports in sorted(snapshot.job_ports().items())},
        "job_kinds": {job: kind.value for job, kind in sorted(snapshot.job_kinds().items())},
        "unshapeable": dict(sorted(snapshot.unshapeable.items())),
        "contested_ports": sorted(snapshot.contested_ports()),
        "job_pod_endpoints": {
            job: [f"{address}:{port}" for address, port in sorted(found)]
            for job, found in sorted(snapshot.job_pod_endpoints().items())
        },
        "members": [{"job": j, "role": r, "processes": n} for j, r, n in snapshot.members],
        "problems": list(snapshot.problems),
        "process_events": snapshot.process_events,
        "processes_from": snapshot.processes_from,
        "events_lost": snapshot.events_lost,
    }
