"""Which controller replica leads, decided in etcd, with a fencing incarnation etcd orders.

Keys, under the prefix (default /tensorlights/controller):
  leader       the leader's address as agents dial it, attached to its lease: it goes when
               the lease expires or the leader resigns
  incarnation  the incarnation of the latest leader (decimal nanoseconds). A replica becomes
               leader in one transaction that creates `leader` (only if absent) and writes
               incarnation = max(its clock, the last + 1), guarded by `incarnation`'s mod
               revision: two replicas can never both win, nor take the same incarnation, and
               each leader's is above every earlier one's (across restarts of everything, as
               long as etcd keeps its data). Plans carry it: agents take a plan only if its
               (incarnation, generation) is not older than the one they follow, so no agent
               follows two leaders' plans out of order.

Timing (TTL = the lease's, whole seconds): a leader renews its lease every TTL / RENEWALS.
It counts its term valid until the moment it *sent* its last successful renewal + TTL (etcd
restarts the TTL when the renewal arrives, which is later), and steps down STEP_DOWN_SHARE x
TTL before that. So once its renewals stop getting through (etcd down, or a partition), it
stops leading before etcd lets the lease expire and another replica can win. A new leader
follows at most TTL after the old leader's last renewal (plus a campaign's retry).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from tensorlights.controller.etcd import (
    Compare,
    EtcdClient,
    EtcdError,
    get,
    put,
    range_value,
)

PREFIX = "/tensorlights/controller"
RENEWALS = 5
"""Renewals per TTL."""
STEP_DOWN_SHARE = 0.2
"""How long before its term's end a leader stops leading, as a share of the TTL: more than
a renewal interval's worth of time, so one late renewal does not end a term."""


@dataclass(frozen=True)
class Term:
    """One replica's leadership."""

    incarnation: int
    lease: int
    valid_until: float
    """Monotonic seconds: the lease cannot have expired in etcd before then."""


class Election:
    def __init__(
        self,
        client: EtcdClient,
        address: str,
        ttl_s: int,
        prefix: str = PREFIX,
        clock: Callable[[], float] = time.monotonic,
        wall_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        if ttl_s < 2:
            raise ValueError("the election's TTL is at least 2 s")
        self.client = client
        self.address = address
        self.ttl_s = ttl_s
        self._leader_key = f"{prefix}/leader".encode()
        self._incarnation_key = f"{prefix}/incarnation".encode()
        self._clock = clock
        self._wall_ns = wall_ns
        self.known_leader: str | None = None
        """The leader's address as last read (None: none, or not known)."""

    @property
    def renew_every_s(self) -> float:
        return self.ttl_s / RENEWALS

    def step_down_at(self, term: Term) -> float:
        return term.valid_until - STEP_DOWN_SHARE * self.ttl_s

    def campaign(self) -> Term | None:
        """Try to become leader: the new term, or None (then `known_leader` says who leads)."""
        sent = self._clock()
        lease = self.client.grant(self.ttl_s)
        last = self.client.get(self._incarnation_key)
        last_incarnation = int(last.value) if last is not None and last.value.isdigit() else 0
        incarnation = max(self._wall_ns(), last_incarnation + 1)
        won, responses = self.client.txn(
            [
                Compare(self._leader_key, "CREATE", 0),
                Compare(self._incarnation_key, "MOD", last.mod_revision if last else 0),
            ],
            [
                put(self._leader_key, self.address.encode(), lease),
                put(self._incarnation_key, str(incarnation).encode()),
            ],
            [get(self._leader_key)],
        )
        if won:
            self.known_leader = self.address
            return Term(incarnation, lease, sent + self.ttl_s)
        with contextlib.suppress(EtcdError):  # it expires by itself
            self.client.revoke(lease)
        current = range_value(responses)
        self.known_leader = current.value.decode() if current is not None else None
        return None

    def renew(self, term: Term) -> Term | None:
        """The term with its renewed validity; None when the lease is gone (another replica
        may lead already). Raises EtcdError when etcd cannot be reached."""
        sent = self._clock()
        ttl = self.client.keepalive(term.lease)
        if ttl <= 0:
            return None
        return replace(term, valid_until=sent + ttl)

    def resign(self, term: Term) -> None:
        """End a term now (a clean stop): revoking the lease deletes the leader key with it,
        so another replica can win at once instead of after the TTL."""
        self.client.revoke(term.lease)
        self.known_leader = None

    def leader(self) -> str | None:
        """Who leads now, as etcd says."""
        current = self.client.get(self._leader_key)
        self.known_leader = current.value.decode() if current is not None else None
        return self.known_leader
