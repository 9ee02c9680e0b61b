from __future__ import annotations

from collections.abc import Iterator

import pytest

from .agentproc import AgentProcess


@pytest.fixture
def agents() -> Iterator[list[AgentProcess]]:
    """Agents a test starts (append them); all stopped at the end, even on failure."""
    started: list[AgentProcess] = []
    try:
        yield started
    finally:
        for agent in started:
            agent.stop()
