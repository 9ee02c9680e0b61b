"""Liveness as /healthz reports it: the last successful reconcile must be recent."""

from __future__ import annotations

import threading
from collections.abc import Callable


class Health:
    def __init__(self, max_age_s: float, clock: Callable[[], float]) -> None:
        self.max_age_s = max_age_s
        self._clock = clock
        self._started = clock()
        self._last_success: float | None = None
        self._last_error = ""
        self._lock = threading.Lock()

    def success(self) -> None:
        with self._lock:
            self._last_success = self._clock()
            self._last_error = ""

    def failure(self, message: str) -> None:
        with self._lock:
            self._last_error = message

    def check(self) -> tuple[bool, str]:
        """(healthy, one line saying why)."""
        with self._lock:
            now = self._clock()
            if self._last_success is None:
                waited = now - self._started
                if waited <= self.max_age_s:
                    return True, "starting"
                return False, f"no successful reconcile in {waited:.1f}s: {self._last_error}"
            age = now - self._last_success
            if age > self.max_age_s:
                reason = self._last_error or "the reconcile loop is not progressing"
                return False, f"last successful reconcile {age:.1f}s ago: {reason}"
            return True, f"ok: last successful reconcile {age:.2f}s ago"
