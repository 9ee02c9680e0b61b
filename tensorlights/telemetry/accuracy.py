"""Measured iterations against a workload's own log of when each worker had its parameters
(pure). Tolerance per the telemetry goal: within 10% or 10 ms, whichever is larger."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

MATCH_WINDOW_S = 0.05
ABSOLUTE_TOLERANCE_S = 0.010
RELATIVE_TOLERANCE = 0.10


@dataclass(frozen=True)
class Measured:
    last_done: float
    spread: float
    period: float | None


@dataclass(frozen=True)
class Agreement:
    iterations: int
    """Iterations in the workload's log."""
    matched: int
    spread_ok: int
    period_checked: int
    period_ok: int
    spread_errors: tuple[float, ...]
    period_errors: tuple[float, ...]

    @property
    def spread_share(self) -> float:
        return self.spread_ok / self.iterations if self.iterations else 0.0

    @property
    def period_share(self) -> float:
        return self.period_ok / self.period_checked if self.period_checked else 0.0


def within(measured: float, truth: float) -> bool:
    return abs(measured - truth) <= max(ABSOLUTE_TOLERANCE_S, RELATIVE_TOLERANCE * abs(truth))


def compare(received: Sequence[Sequence[float]], measured: Sequence[Measured]) -> Agreement:
    """`received[w][k]`: when worker w had iteration k's parameters (monotonic seconds)."""
    iterations = min((len(times) for times in received), default=0)
    truth_last = [max(times[k] for times in received) for k in range(iterations)]
    truth_first = [min(times[k] for times in received) for k in range(iterations)]
    matched = spread_ok = period_checked = period_ok = 0
    spread_errors: list[float] = []
    period_errors: list[float] = []
    for k in range(iterations):
        best = min(measured, key=lambda m: abs(m.last_done - truth_last[k]), default=None)
        if best is None or abs(best.last_done - truth_last[k]) > MATCH_WINDOW_S:
            continue
        matched += 1
        truth_spread = truth_last[k] - truth_first[k]
        spread_errors.append(best.spread - truth_spread)
        spread_ok += within(best.spread, truth_spread)
        if k > 0 and best.period is not None:
            truth_period = truth_last[k] - truth_last[k - 1]
            period_checked += 1
            period_errors.append(best.period - truth_period)
            period_ok += within(best.period, truth_period)
    return Agreement(
        iterations=iterations,
        matched=matched,
        spread_ok=spread_ok,
        period_checked=period_checked,
        period_ok=period_ok,
        spread_errors=tuple(spread_errors),
        period_errors=tuple(period_errors),
    )
