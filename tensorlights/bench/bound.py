"""The lower bound on a scenario's average job completion time (pure).

Two things no policy can beat:
  1. a job finishes no sooner than it would alone: C_i >= a_i + T_i, with a_i its arrival and
     T_i its measured standalone JCT;
  2. a link carries one byte at a time: whatever set S of jobs is finished by time t, all
     their pushes went over their links, so t >= M_h(S) for every link h, the earliest time
     link h of rate R, serving pushes no sooner than their job's arrival, can send all of
     S's bytes over it: M_h(S) = the end of "sort S by arrival; t = max(t, a_j) + p_hj", with
     p_hj = W_hj / R and W_hj job j's wire bytes on link h (payload x (MSS + headers) / MSS:
     1514 bytes on the wire per 1448 of payload with TCP timestamps on a 1500-byte MTU
     Ethernet link); M(S) = the largest over the links.

In any schedule, order the jobs by completion: the k-th to finish, sigma_k, ends at
C >= max(a_sigma_k + T_sigma_k, M({sigma_1 .. sigma_k})). So

    LB = min over orders sigma of (1/n) * sum_k [ max(a_sk + T_sk, M(s_1..s_k)) - a_sk ]

is a lower bound on the average JCT (C_i - a_i). n! orders: fine for the handful of jobs a
host shares (refused above 8). It does not assume any particular policy; it ignores the
workers' compute overlapping other jobs' pushes, which only makes it lower (still valid).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping

from tensorlights.errors import ConfigError
from tensorlights.policy.packing import HEADER_BYTES, MSS, wire_bytes

__all__ = ["HEADER_BYTES", "MSS", "link_seconds", "lower_bound_avg_jct", "wire_bytes"]
MAX_JOBS = 8


def link_seconds(payload: int, rate_bps: float) -> float:
    """How long the link needs for `payload` bytes of pushes."""
    return wire_bytes(payload) * 8 / rate_bps


def link_makespan(
    jobs: list[str], arrival: Mapping[str, float], link_s: Mapping[str, float]
) -> float:
    """M(S): the earliest time the link can have sent every job of S."""
    t = 0.0
    for job in sorted(jobs, key=lambda j: arrival[j]):
        t = max(t, arrival[job]) + link_s[job]
    return t


def lower_bound_avg_jct(
    alone_s: Mapping[str, float],
    link_s: Mapping[str, Mapping[str, float]],
    arrival: Mapping[str, float],
) -> float:
    """LB on the average JCT (module docstring). `link_s`: per link, each job's link time on
    it (a job absent from a link sends nothing over it). Jobs: the keys of `alone_s`, which
    `arrival` and the links must name, no other."""
    jobs = sorted(alone_s)
    on_links = {job for times in link_s.values() for job in times}
    if on_links != set(jobs) or set(jobs) != set(arrival):
        raise ConfigError("alone, link and arrival times must name the same jobs")
    if not jobs:
        raise ConfigError("no jobs")
    if len(jobs) > MAX_JOBS:
        raise ConfigError(f"the bound enumerates orders: at most {MAX_JOBS} jobs")
    best = float("inf")
    for order in itertools.permutations(jobs):
        total = 0.0
        for k, job in enumerate(order):
            done = max(
                arrival[job] + alone_s[job],
                *(
                    link_makespan([j for j in order[: k + 1] if j in times], arrival, times)
                    for times in link_s.values()
                ),
            )
            total += done - arrival[job]
            if total >= best:
                break
        best = min(best, total)
    return best / len(jobs)
