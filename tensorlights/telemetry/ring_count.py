"""A ring's iterations counted by its bytes (pure).

A rank of a ring all-reduce sends the same bytes every iteration: 2 x (ranks - 1) / ranks of
the gradients (12,002,240 bytes for an 8 MB model on four ranks, DDP over gloo). The
tracker (straggler.py) cuts a ring's traffic where it finds the compute between
all-reduces, and where the rank's steps wait on a peer held back elsewhere it cuts one
all-reduce into pieces, or merges two (docs/design.md: 5-51 of 25 per host in c2). The
pieces' bytes still add up: an all-reduce ends where the bytes since the last one's end
reach the bytes per iteration B.

B and where the iterations end are learnt from the recent pieces alone, no launcher's word
needed: a candidate is a piece's size that recurred; the pieces' ends are taken modulo
the candidate (the start-up's bytes, DDP's first broadcast of the model, shift them all
alike), and the residue most of them share marks the iterations' ends. B is the candidate
that best explains the pieces: the share of their ends it marks times the share of the
spans between consecutive marked ends that are one B long. A fraction of B (a split piece
that recurs) marks the ends B marks and more, but most spans between them are several of
it; a multiple of B (two all-reduces merged) has spans of one but marks about half the
ends; B itself loses only the splits' ends and the merges' spans. The best candidate is
waited for until it has marked MIN_MARKED ends (a fraction marks more, so it would get there
first), and a B learnt is kept while it scores within WAIT_MARGIN of the best (a short run's
merged pairs may outscore it by a little). Until B is known the pieces are held; then the
iterations are reported from the first marked end on, each standing for the multiples of B
its bytes span (`Iteration.count`).

The first reported iteration, at the first marked end a whole B in, counts one whatever its
bytes: the start-up's bytes cannot be told from an iteration's there (a broadcast of 16 MB
reads as one iteration of 12 MB and 4 MB more), so a host's count may be one off, more where
that first report holds merged all-reduces as well (counting the multiples of B there
instead put a B learnt wrong at the start into the total for good: 33 of 25 on c2's traces).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import deque
from dataclasses import dataclass, field, replace
from itertools import pairwise

from tensorlights.telemetry.straggler import Iteration

PIECES_KEPT = 48
"""Recent pieces B and the residue are learnt from (a few dozen iterations of the ring)."""
TOLERANCE = 0.005
"""Of B: how far a sum may lie from a multiple of B and still be one (a piece's bytes
acknowledged vary by a control message or two: ~100 bytes in 12 MB)."""
SCORE = 0.35
"""What B must score at least (module doc): with 0.5, rings split about once an all-reduce
never got a B in 15 all-reduces (tests/unit/test_ring_count.py)."""
MIN_MARKED = 8
"""Marked ends needed before B is believed (with 3 or 5, pieces of a quarter or a twelfth of
B, split at the start, passed: c2's traces)."""
WAIT_MARGIN = 1.25
"""A candidate scoring more than this many times a believed one is waited for (until it has
MIN_MARKED ends) rather than the believed one taken (`_learn`)."""


@dataclass
class RingCounter:
    """One collective job's pieces in, its iterations out (see the module doc)."""

    pieces: deque[Iteration] = field(default_factory=lambda: deque(maxlen=PIECES_KEPT))
    """Recent pieces, oldest first; `ends` holds their cumulative bytes at each end."""
    ends: deque[int] = field(default_factory=lambda: deque(maxlen=PIECES_KEPT))
    sent: int = 0
    """Bytes of every piece so far."""
    seen: int = 0
    """Pieces so far (the ring's count while B is unknown: TelemetrySampler.loads)."""
    held: list[Iteration] = field(default_factory=list)
    """Pieces since the last reported iteration's end (all of them while B is unknown)."""
    held_from: int = 0
    """`sent` at the last reported iteration's end."""
    last: Iteration | None = None
    """The last reported iteration (None: none yet)."""
    bytes_per_iteration: int | None = None
    first_at: int = 0
    """`sent` at the first reported iteration's end."""

    @property
    def total(self) -> int:
        """Iterations done by now, reckoned with B as learnt now: right again once a B
        learnt wrong at the start (a split piece that recurred, before the ring ran whole)
        is learnt anew, where the reports' own counts stay as they were made."""
        size = self.bytes_per_iteration
        if self.last is None or size is None:
            return 0
        return 1 + round((self.held_from - self.first_at) / size)

    def add(self, piece: Iteration) -> list[Iteration]:
        """The iterations that `piece` ends, if any (several once B is first known: the held
        pieces' iterations)."""
        self.sent += piece.pushed_bytes
        self.seen += 1
        self.pieces.append(piece)
        self.ends.append(self.sent)
        self.held.append(piece)
        if len(self.held) > PIECES_KEPT:  # never learnt: the oldest go unreported
            self.held_from += self.held.pop(0).pushed_bytes
        learnt = _learn(list(self.ends), self.bytes_per_iteration)
        if learnt is None:
            return []
        size, residue = learnt
        self.bytes_per_iteration = size
        done: list[Iteration] = []
        # Held pieces (all of them, the first time B is known) are cut at every marked end.
        held, self.held = self.held, []
        at = self.held_from
        for one in held:
            at += one.pushed_bytes
            self.held.append(one)
            # An end a sliver past the last one's (a control message) is not another, and the
            # first lies a whole B in at least (a start-up longer than B has marked ends too).
            least = size / 2 if self.last is not None else size * (1 - TOLERANCE)
            if _near(at - residue, size) and at - self.held_from >= least:
                done.append(self._report(at, size))
        return done

    def _report(self, at: int, size: int) -> Iteration:
        pieces, self.held = self.held, []
        span = at - self.held_from
        self.held_from = at
        count = 1 if self.last is None else max(1, round(span / size))
        first, final = pieces[0], pieces[-1]
        period = None if self.last is None else (final.last_done - self.last.last_done) / count
        iteration = replace(
            final,
            connections=max(p.connections for p in pieces),
            push_seconds=final.last_done - (first.last_done - first.push_seconds),
            period=period,
            pushed_bytes=span,
            idle_before_s=first.idle_before_s,
            count=count,
        )
        if self.last is None:
            self.first_at = at
        self.last = iteration
        return iteration


def _near(value: int, size: int) -> bool:
    """Whether `value` lies within TOLERANCE of a multiple of `size`."""
    off = value % size
    return min(off, size - off) <= TOLERANCE * size


@dataclass(frozen=True)
class _Candidate:
    size: int
    residue: int
    score: float
    marked: int

    def believed(self) -> bool:
        return self.score >= SCORE and self.marked >= MIN_MARKED


def _learn(ends: list[int], learnt: int | None = None) -> tuple[int, int] | None:
    """(B, the residue of the iterations' ends) from the pieces' cumulative `ends`, or None
    while no candidate is believed (module doc); `learnt`: B as learnt so far, kept while it
    scores nearly as well as the best (two merged all-reduces recurring in a short run
    outscored it by a little, and were counted one)."""
    sizes = [b - a for a, b in zip([0, *ends], ends, strict=False)][1:]  # the first: partly unseen
    candidates: list[_Candidate] = []
    for size in sorted(sizes):  # one per cluster of near-equal sizes that recurs
        if candidates and _close(size, candidates[-1].size):
            continue
        if sum(_close(size, other) for other in sizes) < 2:
            continue
        residue, _ = _residue(ends, size)
        marked = [end for end in ends if _near(end - residue, size)]
        singles = sum(round((b - a) / size) == 1 for a, b in pairwise(marked))
        score = len(marked) / len(ends) * singles / max(1, len(marked) - 1)
        candidates.append(_Candidate(size, residue, score, len(marked)))
    if not candidates:
        return None
    # The best scored, once it has marked enough ends; meanwhile a believed one only if it
    # scores nearly as well. A split piece that recurs marks more ends than the all-reduce,
    # so it reaches MIN_MARKED first (the DDP test in CI: halves 0.50 while the whole
    # scored 0.78 on 7 marked ends); and a short run may end before the best has enough
    # (the whole 0.51 on 11, two merged 0.54 on 7).
    best = max(candidates, key=lambda c: c.score)
    believed = [c for c in candidates if c.believed()]
    kept = [c for c in believed if learnt is not None and _close(c.size, learnt)]
    second = max(kept or believed, key=lambda c: c.score, default=None)
    if second is not None and second.score * WAIT_MARGIN >= best.score:
        return second.size, second.residue
    return (best.size, best.residue) if best.believed() else None


def _close(a: int, b: int) -> bool:
    return abs(a - b) <= TOLERANCE * max(a, b)


def _residue(ends: list[int], size: int) -> tuple[int, int]:
    """The residue modulo `size` most `ends` share (within TOLERANCE), and how many do."""
    residues = sorted(end % size for end in ends)
    around = [r - size for r in residues] + residues + [r + size for r in residues]
    slack = TOLERANCE * size
    best, marked = 0, 0
    for residue in residues:
        count = bisect_right(around, residue + slack) - bisect_left(around, residue - slack)
        if count > marked:
            best, marked = residue, count
    return best, marked
