"""The baselines that are not TensorLights, built the way their authors did: `tc` commands.

* The HPBDC'19 prototype (TL-RR "original"): every rotation deletes the root qdisc and adds
  it again -- HTB, a root class at the link rate, a default class, one class per job (rate
  1 mbit, ceil = link, HTB prio = the job's rank after the green one, 7 levels, jobs beyond
  them share the last) and one u32 `match ip sport` filter per PS port -- one `tc` process per
  command. Packets queued in the old qdisc are discarded with it.
* Fair: the same tree with every job at the same priority and an equal rate (link / jobs),
  built once: per-job classes, no light.

Filters match the source port: the PS's listening port, which the prototype's launcher
fixed and the synthetic PS answers its workers from, and every further local port of a job
that the benchmark's port feed finds (a real framework's ephemeral ports; on a ring's rank
host, its gloo pairs'). (TensorLights itself speaks netlink and finds ephemeral ports by
process; this module exists only to reproduce the others.)
"""

from __future__ import annotations

from collections.abc import Sequence

from tensorlights.testbed import netns

PRIO_LEVELS = 7
DEFAULT_CLASS = 999
QUANTUM = 60_000  # equal quanta: HTB then shares equal-prio classes by their rate


def original_prios(jobs: int, green: int) -> list[int]:
    """HTB prio of each job (by index) when job `green` has the light."""
    return [min((i - green) % jobs, PRIO_LEVELS - 1) for i in range(jobs)]


def order_prios(order: Sequence[int]) -> list[int]:
    """HTB prio of each job (by index) under a fixed order, green first."""
    prios = [0] * len(order)
    for rank, job in enumerate(order):
        prios[job] = min(rank, PRIO_LEVELS - 1)
    return prios


def htb_commands(
    dev: str,
    rate_bps: int,
    ports: Sequence[Sequence[int]],
    prios: Sequence[int],
    fair: bool = False,
) -> list[list[str]]:
    """`tc` arguments (without `tc -n NS`) that delete and rebuild the whole tree: job i's
    ports go to class 1:(10+i) at HTB prio prios[i]."""
    link = f"{rate_bps}bit"
    default_rate = max(rate_bps // 20, 8000)  # unmanaged traffic: 5% guaranteed
    job_rate = (rate_bps - default_rate) // max(len(ports), 1) if fair else 1_000_000
    cmds = [
        ["qdisc", "del", "dev", dev, "root"],
        ["qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", str(DEFAULT_CLASS)],
        ["class", "add", "dev", dev, "parent", "1:", "classid", "1:1", "htb", "rate", link,
         "ceil", link],
        ["class", "add", "dev", dev, "parent", "1:1", "classid", f"1:{DEFAULT_CLASS}", "htb",
         "rate", f"{default_rate}bit", "ceil", link, "prio", str(PRIO_LEVELS),
         *(["quantum", str(QUANTUM)] if fair else [])],
    ]  # fmt: skip
    for i, (job_ports, prio) in enumerate(zip(ports, prios, strict=True)):
        cmds.append(
            ["class", "add", "dev", dev, "parent", "1:1", "classid", f"1:{10 + i}", "htb",
             "rate", f"{job_rate}bit", "ceil", link, "prio", str(prio),
             *(["quantum", str(QUANTUM)] if fair else [])]
        )  # fmt: skip
        cmds.extend(port_filter(dev, port, i) for port in sorted(job_ports))
    return cmds


def port_filter(dev: str, port: int, job_index: int) -> list[str]:
    """The u32 filter sending the PS port's packets to job `job_index`'s class."""
    classid = f"1:{10 + job_index}"
    return ["filter", "add", "dev", dev, "parent", "1:", "protocol", "ip", "prio", "1", "u32",
            "match", "ip", "sport", str(port), "0xffff", "flowid", classid]  # fmt: skip


def rebuild(ns: str, commands: list[list[str]]) -> None:
    """Run the commands, one `tc` each, as the prototype did. The first (deleting the root
    qdisc) may fail when there is none yet."""
    for index, cmd in enumerate(commands):
        netns.run(["tc", "-n", ns, *cmd], check=index > 0)
