"""The green-light changes this agent applied, newest last (status shows the last 20)."""

from __future__ import annotations

from tensorlights.agent.reconcile import PassResult
from tensorlights.agent.status import AppliedRotationView

KEEP = 20


class RotationLog:
    def __init__(self, keep: int = KEEP) -> None:
        self._keep = keep
        self._recent: tuple[AppliedRotationView, ...] = ()

    def record(self, result: PassResult, wall_offset: float) -> AppliedRotationView | None:
        """The pass's rotation, if the light moved to a job (times in Unix seconds; applied:
        when its kernel write was done)."""
        plan = result.plan
        if not plan.rotated or plan.green is None:
            return None
        since = None if plan.green_since is None else plan.green_since + wall_offset
        rotation = AppliedRotationView(
            plan.green, since, result.written_at + wall_offset, plan.generation
        )
        self._recent = (*self._recent, rotation)[-self._keep :]
        return rotation

    @property
    def recent(self) -> tuple[AppliedRotationView, ...]:
        return self._recent
