"""The `pack` policy's inputs and ordering (pure: measurements and time come in as arguments).

What the host measures per job (telemetry): the bytes one iteration pushes and when each push
starts and ends. From them:
  link_s     the link time one iteration's pushes need at the link rate (wire bytes / rate);
  compute_s  the idle time before each push (from the previous iteration's end to the push's
             start): the workers' compute, which does not need the link, however long the
             push then waits in a queue. Waiting still lengthens it elsewhere: a job held in
             a lower band gets its workers' answers, and starts its next push, later (real
             PyTorch RPC jobs: 0.45-0.63 s measured while starved, 0.15 s once green), so its
             demand read low and `pack` put it ahead of the equal job it waited behind, two
             iterations before that one ended (real gloo jobs: 0.36-0.81 s against 0.15-0.18
             s; sending their pure ACKs in the top band did not change it). So the compute
             comes from *unhindered* iterations only, whose push took at most
             UNHINDERED_FACTOR x its link time (+ UNHINDERED_SLACK_S): the second shortest
             idle before them (one misread sample aside; waiting only ever adds); a job
             without one (a small job always behind a big one) reads it from all its
             iterations, and its load is marked not `settled`;
  demand     link_s / (link_s + compute_s): the share of the link the job uses running at
             its standalone speed.

Order (green first): starving jobs first (see below), then jobs by measured demand, smallest
first -- with equal iterations that is shortest-job-first, and a prefix of the order whose
demands sum to <= 1 fits on the link together: under strict priority the lower one's pushes
slide into the upper one's compute gaps and both run at their standalone speed (a shared
FIFO band would instead keep their pushes locked in phase, each stretching the other) --
then jobs not measured yet. Demands within x1.3 of a group's smallest count as equal, so
measurement noise does not reorder equal jobs; within a group, remaining work decides where
it is known (the controller passes Slurm time limits: the soonest to end first; where every
job of the group declared its iterations, the least remaining standalone time first,
REMAINING_BUCKET), the order in force otherwise, and under the controller a job no job ahead
holds back on any of its hosts goes first (free_first). A waiting job that declared its
iterations and pushes the green job's bytes (a trial of the same model: a sweep's trials
launched longest first) joins the green job's group before its own demand can be believed
(or the group of another declaring job of its bytes whose demand is: under the controller
the green job's own is not trusted for its first iterations on top, and the waiting trial's
demand went unreported for them, g traced), so its length can put it first: without that,
the short trial waited in a lower band for the long one to end, as under TL-One (the
benchmark's g and r5). And until such a trial's length orders it, while it is young, it
sends in the band of the last measured job ahead of it other than the green one, where it
declared clearly fewer iterations than the green job has left (measured_beside): below two
jobs that fill the link (g), it completed its first iteration only ~8 s in and its length
came too late; beside the second job, its pushes interleave with that job's. Under the
controller it stays there until its agent reports a demand the controller orders by: back
below on its first load, it waited 2.5 s for the plan that put it first (g, traced). Its
place in the order stays, and the green job's band is its own. A job's demand orders it once
it rests on MEASURED_AFTER iterations measured on top (green): below another job, real
frameworks' idle before their pushes reads 2-5x their compute (TensorFlow's even where its
pushes look unhindered), their demands read low, and `pack` put a waiting job ahead of the
equal one on top, midway through it. A waiting job is ordered by its demand before that only
when it pushes clearly fewer bytes than the job on top (DEMAND_BUCKET): a smaller job for
sure, whatever its compute, and known once SMALLER_AFTER of its pushes are measured -- a PS
job only: a waiting ring job's bytes per iteration read low too
(JobLoad.bytes_hold_waiting), and the controller moved the light to such a job 2-16 s into
the job on top in 5 of 6 runs of three equal DDP jobs. A job not measured yet keeps its
place while it is young (MEASURE_GRACE_S from its first push, or not pushing yet): measuring
it takes a few iterations, and moving it meanwhile made the light flip twice at a run's
start (behind a job measured first, then ahead again). A job that has not pushed yet held no
place before: whichever job a host saw push first went ahead, so hosts deciding alone each
put a different job of c1's two green (DDP's rendezvous and first broadcast reach each
rank's host at a different time). Keeping its place, it stays behind the measured jobs that
were ahead of it: held to its slot instead, a job measured below it that moved up pushed
them behind it (r3 on an H200 host: the 1 MB job moved to the top past the 3 MB job, and the
6 MB one, never on top and so never ordered, took the 3 MB job's place and kept it to the
end).

Starvation bound (StarvationGuard): a job whose time lost to waiting over its life so far
(at least `window_s`, at most the last HORIZON_WINDOWS windows) approaches what
`max_slowdown` allows is promoted to the front until it has caught up; a job promoted stays
ahead of those promoted after it. A job that pushed and was green MEASURE_GRACE_S without
completing an iteration is not iterative (a bulk copy): never promoted for its lag, which
would only grow, and would keep it green for good. Nor is a measured job that has stopped
pushing and iterating (IDLE_AFTER_S: its run over while its processes stay, or paused): it
is not waiting. A job that declares its iterations (its
launcher, or the user, sets TENSORLIGHTS_ITERATIONS) is judged by its deadline instead:
promoted only once it must run at full speed from then on to end within the bound. Its past
waiting alone cannot tell a job that will still end within the bound from one that will
not, and the lag rule paid 8-12% of average JCT over TL-One in the simulator where the jobs
outlive the window and TL-One kept every job under the bound (docs/benchmarks.md, `--scale
3`). A job whose only company here is its siblings (the same model launched with it) is
taken to be as long as they are, and keeps waiting while it would end within the bound
behind all of them (StarvationGuard.waits_in_time).
"""

from __future__ import annotations

import heapq
import math
import statistics
from collections import deque
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

MSS = 1448
HEADER_BYTES = 14 + 20 + 20 + 12  # Ethernet, IPv4, TCP, TCP timestamps
DEMAND_BUCKET = 1.3
PROMOTE_AT = 0.8
RELEASE_AT = 0.5
MEASURED_AFTER = 5
"""Iterations a job's demand rests on before it orders the job: the first one or two of a
real framework's job measured 0.44 where the job's steady demand was 0.78 (its first gaps
include start-up), and moved it ahead of an equal job and back."""
SMALLER_AFTER = 3
"""Pushes a waiting PS job's bytes rest on before they show it smaller than the job on
top, whose own reading rests on as many (the median of its pushes: one odd push aside; on
two, a green gloo job's first iteration, read merged with the second, made its bytes 25%
high against an equal job's: r2, 2026-12-07). Its compute does not matter there, and
below two jobs a waiting job's iterations take seconds each: held to MEASURED_AFTER, r3's
1 MB job waited below the 3 MB one 4 s after its first two pushes had shown it a third of
the size (H200 host, traced), and ended at 11.5 s, 7.3-8.9 s in the other runs. The job on
top, measured where it is, is then placed by its demand on as many: waiting for its fifth
iteration kept r3's 1 MB and 3 MB jobs below the 6 MB one 2 s more (this VM, traced)."""
UNHINDERED_FACTOR = 2.0
UNHINDERED_SLACK_S = 0.02
"""An iteration's push (its first push's start to its last completion) that took at most
this many times its link time, plus this slack (TCP's slow start after the compute), ran
unhindered: nothing held it back, and its idle before is the job's own compute. Real jobs
on top measure 1.0-1.3x; held in a lower band, 3-6x."""
HORIZON_WINDOWS = 4
"""The guard judges a job's slowdown over its life so far, looking back at most this many
windows. Judged over each window alone, a job that had run at full speed for minutes was
promoted after half a window of waiting, however much of its bound it had left: where jobs
outlive the window, pack paid 9-23% of average JCT over TL-One and the prototype's 20 s
rotation to keep a bound the jobs' completion times did not need (docs/benchmarks.md,
`--scale 3`). The cap bounds how long a job that ran ahead can be made to wait: at most
PROMOTE_AT x (1 - 1/max_slowdown) x this many windows (192 s at 2x and the 120 s default)."""
DEADLINE_AT = 0.88
"""A job that declared its iterations is promoted once its remaining standalone time exceeds
this share of the time left to its deadline, and stays promoted until it ends. The rest is
margin for the period's error: real gloo jobs ran green 5-8% slower than the period they
were reckoned with, below them another job. Chosen with deadlines counted from when the
first push was acknowledged, up to 1.7 s late for a job starved from its start (r2: 2.04x
at 0.9, 2.00-2.10x at 0.85). Counted from when it began, the simulator (exact periods)
promoted r1's second job at 0.85, which ends within 1.81x under TL-One, for 1.8% of the
average; at 0.88 it matches TL-One in r1 at x1 and x3 and keeps r2 (1.97, 1.95); 0.8 paid 7%
over TL-One in r1 at `--scale 3`."""
REMAINING_BUCKET = 1.3
"""Within a group of equal demand, jobs whose declared iterations tell their remaining work
go first, the least first (shortest remaining time first); remaining times within this
factor of a bucket's least count as equal, and keep the order in force: a waiting job's
period reads long and with noise (its compute stretched by the wait), and equal jobs are not
to trade places on it."""
SLACK_SWAP_S = 3.0
"""Two jobs promoted by their deadlines that cannot share the link: the one holding its turn
keeps it until the other's slack (StarvationGuard.slack) falls this far below its own; then
the other goes first. The least slack first keeps the latest of them the least late
(Jackson's rule), and both iterating to the end, the one waiting fills the other's gaps,
where held to its end, the first ended early and the other ran its last seconds alone at its
demand (the simulator's m3 under the controller: j3 ended at 2.03x, j1 at 2.21x after 5.7 s
alone on `ps`; swapped once, 2.17x and 2.16x). The margin keeps the light from trading
places at every update: the one waiting loses slack at most as fast as time passes, the one
green hardly any, so a swap back comes 2 x 3 s later at the earliest. Within 6 s of the
held job's end the margin is half its remaining standalone time: held to 3 s there, the last
swap left the other up to 3 s later than it (m3 declared on the testbed: j1 ended 2.6-3.0 s
after j3 in three runs of three, 2.23x against j3's 2.12x). But where the one held is past
its deadline too, the one passing it within SLACK_SWAP_S must also be due first (its deadline
earlier): passing it by its slack alone, a job with more work left than the one held made the
pair's ends later (the one held by the other's remaining time, the other sooner by less),
and the light moved twice: in (f) on the testbed j4 passed j3 3 iterations from its end,
which waited 1.5 s below and took the light back (results/bench-synthetic-table-1208,
traced). Not while the one held can still end in time: ending beside the other, filling its
gaps, both may (the simulator's r2 declaring, the same rule for it: 1.92x -> 1.97x). Not
between jobs judged by their lag: turns there (by allowance less lag) shared the light among every
overdue job, and the simulator's f, r2 and c1 at `--scale 3` took 5-7% more average JCT, c2 18%
(docs/benchmarks.md)."""
SIBLINGS_AT = 0.9
"""A job waiting for its siblings here keeps waiting while its remaining standalone time,
once they end, is within this share of the time then left to its deadline
(StarvationGuard.waits_in_time): real gloo jobs ran green 5-8% slower than the period
reckoned. Not DEADLINE_AT: that margin also covers a promotion decided iterations ahead and
costs a few tenths of a second when it errs; here, erring, the lag rule promotes the job
at once. At 0.88 the simulator's r1 at `--scale 3` (its waiting job projected to end at
1.90x, TL-One ending it at 1.80x) fell back to the lag rule and paid 10.7% over TL-One."""
MEASURE_GRACE_S = 10.0
"""An unmeasured job keeps its place in pack's order this long after it appeared; past it,
a job still without a demand (traffic that is not iterative) goes behind the measured. And
a job green this long without a demand is not iterative: the starvation guard no longer
promotes it (StarvationGuard.not_iterative)."""
RING_START_UP_S = 20.0
"""A ring's clocks (StarvationGuard) open when it is first measured, or this long after its
first bytes if sooner: on rank 0's host they are DDP's broadcast of the model, 6-12 s before
the first all-reduce on a 2-core VM (2-4 s on an H200 host). With MEASURE_GRACE_S there, `ps`
still opened a waiting ring ~5 s before the other hosts did, at its first bytes + 10 s, and
promoted it 5-8 s before them in c2 (3.2% over TL-RR-original's average, 1.2% with this;
docs/benchmarks.md). A ring that never gets a load, starved of every piece, waits this long
more than a PS job would before its lag counts."""
IDLE_AFTER_S = 10.0
IDLE_PERIODS = 3.0
"""A measured job neither seen pushing (a push in flight) nor completing an iteration for
IDLE_AFTER_S, or IDLE_PERIODS of its standalone period or of its latest pace (seconds an
iteration between its last two counts) where longer, is idle: it has stopped iterating, or
paused, and is not waiting for the link. Its run may be over while its processes stay: a
TensorFlow PS serves until its launcher ends it (the testbed's chief takes up to ~20 s to
exit: a finished job's lag grew 1.4 -> 9.5 s in 8 s of it, 12 s promoting it), a PS writes
its checkpoint. Its lag grows all the same (time present less work done), so the guard
promoted it and, a promoted job keeping its turn, held it so while it idled: its demand
counted against the link, and a job really starving behind it was not promoted
(StarvationGuard.idle). A job that waits is never idle: held in a lower band its push is in
flight nearly all the time, and its gaps between pushes are its compute stretched
(0.36-0.81 s measured for 0.15 s). The latest pace is for a job iterating slowly whose
pushes a host cannot see in flight (the simulator's settled groups model a starving job as
short pushes a minute apart): judged by its standalone period alone, such jobs on a
simulated cluster day were taken for idle and lost their promotions (pack's average JCT
+4.3%, the controller's p95 +23%); judged by their pace, the day is as before to the
second (docs/benchmarks.md). Not a ring's (JobLoad.bytes_hold_waiting False): its rank
here blocks on a peer whose link starves it, nothing of it in flight here, and its count
reads several iterations per all-reduce while it waits, so neither signal means it
stopped (c2 traced: a waiting ring's count on one host stopped 23 s before its end, and
it was taken for idle there 2 s before it)."""


SIBLING_MATCH = 0.02
"""A job that ended here is a present job's sibling if its link time an iteration was
within this share of the present job's (the same bytes: the same model) ..."""
SIBLING_ARRIVAL_S = 10.0
"""... and it appeared within this long of the present job (launched together): SiblingRuns."""
SIBLINGS_KEPT = 32
"""The latest ended jobs' lengths kept (SiblingRuns)."""


def siblings(appeared: float, link_s: float, other_appeared: float, other_link_s: float) -> bool:
    """Two PS jobs are siblings -- the same model launched together -- if they appeared within
    SIBLING_ARRIVAL_S of each other and push the same bytes an iteration (link times within
    SIBLING_MATCH of the first's): SiblingRuns, StarvationGuard.waits_in_time."""
    return (
        abs(appeared - other_appeared) <= SIBLING_ARRIVAL_S
        and abs(link_s - other_link_s) <= SIBLING_MATCH * link_s
    )


def wire_bytes(payload: float, mss: int = MSS, headers: int = HEADER_BYTES) -> float:
    """Bytes on the wire for a TCP payload sent in full-size segments."""
    return payload * (mss + headers) / mss


@dataclass(frozen=True)
class JobLoad:
    link_s: float
    compute_s: float
    iterations: int
    """Iterations completed since the agent began to track the job."""
    busy: bool
    """A push of this job is in flight now."""
    settled: bool = True
    """`compute_s` comes from unhindered iterations (see the module doc); False: from
    iterations that waited (an upper bound on the compute)."""
    bytes_hold_waiting: bool = True
    """Its bytes per iteration read true while it waits: a PS's push is one burst however
    long it waits. Not a ring's (a collective job): each of its steps waits on a peer, and
    while it waits below another job its steps slide into that job's gaps one by one, so
    one all-reduce reads as several iterations of fewer bytes. The agent now regroups such
    pieces by bytes (telemetry/ring_count.py), but what the guard would do with a ring's
    count believed is not measured yet: a ring's stays False."""
    counted_from_start: bool = True
    """Its iterations are counted from its first push on (the agent met it before it had
    pushed): ended, its count is its run's length (SiblingRuns)."""
    answer_s: float | None = None
    """The workers' compute as their answers show it: from a push's end to the first bytes
    of a worker's answer on its connection (the second shortest of the recent ones; None
    where workers do not answer on the push connections). Waiting lengthens it less than
    the idle before the next push, which also holds the rest of the answers, sent while
    the PS's own packets (its ACKs) wait below the green job."""
    pushes_read: int | None = None
    """The pushes `link_s` is the median of (job_load: at most its `newest`); None: as many
    as its iterations, up to any median's first odd push aside (a load made by hand)."""

    @property
    def pushes_in_reading(self) -> int:
        return self.iterations if self.pushes_read is None else self.pushes_read

    @property
    def standalone_period_s(self) -> float:
        return self.link_s + self.compute_s

    @property
    def demand(self) -> float:
        period = self.standalone_period_s
        return self.link_s / period if period > 0 else 1.0

    @property
    def deadline_period_s(self) -> float:
        """The standalone period a deadline is reckoned with: the shorter compute reading
        (StarvationGuard)."""
        if self.answer_s is None:
            return self.standalone_period_s
        return self.link_s + min(self.compute_s, self.answer_s)


@dataclass(frozen=True)
class Measured:
    """What telemetry measured of one iteration, as pack reads it."""

    pushed_bytes: int
    idle_before_s: float | None
    """From the previous iteration's end to this one's push start."""
    period_s: float
    """From the previous iteration's end to this one's."""


def unhindered(measured: Measured, link_rate_bps: float) -> bool:
    """Whether the iteration's push ran at the link's speed (see UNHINDERED_FACTOR)."""
    return _unhindered(measured, wire_bytes(8.0) / link_rate_bps)


def _unhindered(measured: Measured, byte_s: float) -> bool:
    """`byte_s`: a payload byte's link time (computed once per reading: the agent and the
    simulator read a job's load at every push, over its recent iterations)."""
    if measured.idle_before_s is None:
        return False
    push_s = measured.period_s - measured.idle_before_s
    return push_s <= UNHINDERED_FACTOR * measured.pushed_bytes * byte_s + UNHINDERED_SLACK_S


def _second_shortest(values: Iterable[float]) -> float | None:
    """One misread sample aside, the shortest (waiting only ever adds)."""
    shortest = heapq.nsmallest(2, values)
    return shortest[-1] if shortest else None


def job_load(
    recent: Sequence[Measured],
    newest: int,
    iterations: int,
    busy: bool,
    link_rate_bps: float,
    answers: Iterable[float] = (),
) -> JobLoad | None:
    """A job's load from its `recent` iterations, oldest first: the bytes of the `newest` few
    (median) and the compute (the second shortest idle before an unhindered one, else before
    any: then not settled; see the module doc); None without either. `answers`: the recent
    times from a push's end to its answer (JobLoad.answer_s)."""
    pushed = [m.pushed_bytes for m in recent[-newest:]] if newest > 0 else []
    byte_s = wire_bytes(8.0) / link_rate_bps
    clean = [m.idle_before_s for m in recent if _unhindered(m, byte_s)]
    idles = clean or [m.idle_before_s for m in recent]
    compute = _second_shortest(idle for idle in idles if idle is not None)
    if not pushed or compute is None:
        return None
    link_s = wire_bytes(statistics.median(pushed)) * 8 / link_rate_bps
    return JobLoad(
        link_s,
        compute,
        iterations,
        busy,
        settled=bool(clean),
        answer_s=_second_shortest(answers),
        pushes_read=len(pushed),
    )


@dataclass
class StarvationGuard:
    """Keeps every job's slowdown under `max_slowdown` (F), judged over its life so far.

    A job that has been iterating for `present` seconds of the span judged (its life, at most
    the last HORIZON_WINDOWS x `window_s`) and completed `done` iterations of standalone
    period P in it has lost lag = present - done x P to waiting; its slowdown over the span is
    S / (S - lag), which stays <= F while lag <= (1 - 1/F) x S. The guard promotes a job once
    its lag passes PROMOTE_AT of that (it acts before the bound is reached) and releases it
    when the lag is back under RELEASE_AT of it. A job younger than the window is held to the
    window's allowance: its first seconds of waiting are not starvation yet. A job never
    measured (no completed iteration: starved from its start) has lag = present.

    A job promoted stays ahead of those that become candidates after it until it is
    released. Re-sorted by lag at every evaluation, the jobs behind traded the top band at
    every push, each catching up a push's worth on the others: processor sharing, which
    finished all five equal jobs of (f) together and late (78 s simulated against the
    prototype's 66 s, `--scale 3`); held, they take turns of many iterations (67 s).

    A job is present from its first push, or once measured, from when its iterations began
    (its first measured count back at the standalone period): a framework's start-up between
    its first bytes (rendezvous, the first broadcast of the model) and its first iteration
    is no waiting (unless the job was promoted meanwhile: then it was). Counted, it was 8-10 s
    of a DDP job's lag in c1, and a host that saw the first bytes earlier promoted the
    waiting job alone, its ring green there and waiting on the other three hosts.

    A ring (a collective job: `rings`) begins, for every clock the guard keeps of it (its
    span, MEASURE_GRACE_S young, green without a load), when it is first measured here, not
    dated back by its count (its pieces', several per all-reduce while it waits, their gaps
    read as its compute), or RING_START_UP_S after its first bytes if that comes sooner: its
    first bytes are not where its iterations begin on every host alike. On rank 0's host,
    and the next of gloo's broadcast tree, they are DDP's broadcast of the model, 6-12 s
    before the first all-reduce that the other hosts see first (a 2-core VM). Counted from
    them, with hosts deciding alone, `ps` (rank 0's) promoted a waiting ring at 7-12 s into
    c2 where the other hosts did at 18-25 s, or took the green ring, young no more and
    without a load, for not iterative and put it behind, and each ring ran at its slowest
    host's pace while they disagreed (traced: results/bench-c2-provisional,
    results/bench-c2-ring-opening). First measured, the hosts open a ring within 0-4 s of
    each other. A ring never measured is still promoted in the end: starved of every piece,
    it waits RING_START_UP_S more than a PS job would.

    A job that declared its total iterations N (`declared` in update) and has completed
    `done` < N of them is judged by its deadline instead: it ends within the bound F if it
    ends by its first push + F x N x P; its remaining standalone time is R = (N - done) x P.
    From its first push, not from when its iterations began: a job starved from its start
    completes its first iteration late, and the start-up that rule forgives (above) was,
    in r2's third job, 6 s of waiting (simulated: 2.13x against a deadline it met). And
    from when that push began, not when its bytes were acknowledged: held below two jobs
    from its start, r2's last job had its first 16 KiB acknowledged 2.1 s into the run
    (alone, its iterations fill all but ~0.2 s of its 9.5 s), its deadline ~1.7 s late, and
    it ended 1.5 s past the bound (H100 host, traced). Counting
    a framework's start-up as waiting only brings the promotion earlier. It is promoted
    once R > DEADLINE_AT x (deadline - now) and stays promoted until it ends: green, R and
    the time left shrink alike, so the same rule would release it at once and promote it
    again as soon as it waited. (Unless another job promoted by its deadline, which cannot
    share the link with it, has SLACK_SWAP_S less slack, or half R if less (and, where the
    held one is late too, its deadline is the earlier): that one goes first. A job past its
    lag's limit that was never measured -- starved from its start, no iteration of it
    counted, so no length nor deadline -- goes among those that pass
    it by the slack it would have as long as the longest job judged by its deadline here,
    (F - 1) x that length - its lag: in (f) at `--scale 3` the fifth job, starved from its
    start, waited while a third job passed the one held and held the turn itself, and
    ended at 2.54x (traced). Its guessed length alone passes nobody.) P is the
    shortest JobLoad.deadline_period_s the job has read so far (from its MEASURED_AFTER-th
    iteration on, and the latest one): waiting only
    lengthens the reading, and its slack moves by N x (F - 1) + done times any change of P
    (25-50 x in r2), so the latest reading, which fell from 0.40 to 0.37 s once the job was
    green, took 1.5 s of slack away after its promotion, and it ended at 2.05x (traced,
    `bench run --status-traces`). One misread iteration aside: P is the second shortest of
    the shortest readings of each iteration. With the shortest, one reading of 0.331 s at a
    waiting job's 5th iteration (an answer read 0.108 s for 0.15 s of compute), against
    0.38 s at every other, took 2 s from its slack; it was promoted midway, held the light
    to its end, and the job it passed ended at 2.00x (r2 on a 2-core VM, traced). And P is
    its model's: the shortest of those of the jobs pushing its bytes (same_bytes), which
    may be measured green while it waits. Its own, read waiting, stays long until it is
    green: r2's third job read 0.427 s at its 7th iteration, against the green job's 0.370
    s of the same model and 0.386 s alone; its slack read 1.16 s and fell to -0.52 s a
    second later when its reading did, and it was promoted 14.3 s in and ended at 2.12x
    (traced). A job of the same bytes and a longer compute is promoted early for it, not
    late. Until it is measured, or
    once it has completed more iterations than it declared (a wrong declaration, or the
    agent counting another job's traffic), the lag rule judges it; and a ring's (a
    collective job's), whose iterations read several per all-reduce while it waits
    (JobLoad.bytes_hold_waiting): its count of iterations done cannot be believed.

    A job that declared nothing and is past its lag's allowance keeps waiting where every
    other job here is its sibling (the same bytes an iteration, launched within
    SIBLING_ARRIVAL_S of it: a sweep's trials, the same model launched together) and it
    ends within the bound even if it waits for the one green now to end (waits_in_time;
    all of them where no other is green), judged again against the next one green: siblings
    are taken to run as many iterations N, and for k of them of equal period, waiting for
    the others to end costs at most k - 1 times its own length, whatever N, so a pair
    needs only what it gains in their gaps to stay under 2x (and SIBLINGS_AT of margin).
    Judged by the lag alone, the second of two equal jobs that outlive the window was
    promoted midway and both ended late: 8-12% of average JCT over TL-One, which kept both
    within the bound (the simulator's a, r1, r4, m1 and m4 at `--scale 3`; r1 on the
    testbed 11.0%). Judged against all of them to end, r2's starved job at `--scale 3`
    was promoted with the green one 25-28 iterations of 75 from its end, which then waited
    ~20 s behind it: 51.2 s against TL-RR-original's 50.0; waiting for the green one alone,
    47.1 s against 49.8, every job within 1.97x (results/bench-r2-long-wait-green). The
    waiting is judged at every update, and a sibling slower than it
    reads, a job gaining less in the gaps, or a job of other bytes arriving, hands it back
    to the lag rule at once (its lag by then is past its allowance). Siblings of unequal
    length break the premise: a short sweep trial behind a long one waits until the long
    one ends. Under a controller, only where every host of the job says so (`alone` in
    update).

    A measured job that has been neither busy (a push in flight) nor completing iterations
    for IDLE_AFTER_S (or IDLE_PERIODS of its period or its latest pace) is idle (`idle`): it
    is not a candidate, and a promoted one is released. Its lag goes on growing while its processes
    outlive its run (a TensorFlow PS serving until its launcher ends it, a checkpoint being
    written), and promoted for it, it kept its turn and its demand's share of the link
    from the job starving behind it for as long as it stayed.
    """

    max_slowdown: float
    window_s: float
    _history: dict[str, deque[tuple[float, int]]] = field(default_factory=dict)
    _first_seen: dict[str, float] = field(default_factory=dict)
    """When each job began to push (or was first measured); a ring: when first measured, or
    RING_START_UP_S after its first bytes if sooner (class doc)."""
    _iterating_since: dict[str, float] = field(default_factory=dict)
    """When each measured job's iterations began, as of its first measurement."""
    _period_readings: dict[str, dict[int, float]] = field(default_factory=dict)
    """Per job, the shortest deadline period read at each of its iterations, only the two
    shortest of them kept: all the second shortest needs (class doc)."""
    promoted: dict[str, float] = field(default_factory=dict)
    """Promoted job -> its lag (seconds) when last judged, in the order of their turns
    (pack_order keeps it): those passing a held one by their slack, those held (promoted
    earlier, in that order), then the newly promoted, the most behind first."""
    effective_bound: float = 0.0
    """The bound aimed for at the last update (see feasible_bound)."""
    lags: dict[str, float] = field(default_factory=dict)
    """Every job's lag (seconds) when last judged."""
    spans: dict[str, float] = field(default_factory=dict)
    """Every job's span judged (seconds) when last judged: the window at least."""
    slack: dict[str, float] = field(default_factory=dict)
    """Jobs judged by their deadline: how long each can still wait (seconds; its deadline
    less now less its remaining standalone time) when last judged."""
    model_periods: dict[str, float] = field(default_factory=dict)
    """Every PS job's standalone period as of the last update: its model's (class doc,
    _periods_by_model), what its deadline and its remaining work are reckoned at."""
    not_iterative: frozenset[str] = frozenset()
    """Jobs that pushed, were green MEASURE_GRACE_S and still completed no iteration (a bulk
    copy, not a training job) as of the last update: never promoted for their lag."""
    waits_for_siblings: frozenset[str] = frozenset()
    """Jobs past their lag's limit that wait in time for their siblings, all the jobs here,
    as of the last update (waits_in_time): kept waiting where this host orders its jobs
    alone, told to the controller otherwise (`alone` in update)."""
    idle: frozenset[str] = frozenset()
    """Measured jobs neither pushing nor iterating for IDLE_AFTER_S (or IDLE_PERIODS of their
    period or pace) as of the last update: stopped or paused, not waiting: never promoted."""
    _green_unmeasured_s: dict[str, float] = field(default_factory=dict)
    """Per job that began to push, how long it has been green without a load."""
    _active_at: dict[str, float] = field(default_factory=dict)
    """Per measured job, when it was last seen pushing or completing an iteration (idle)."""
    _updated_at: float | None = None

    @property
    def horizon_s(self) -> float:
        return HORIZON_WINDOWS * self.window_s

    def _opened(self, job: str, now: float) -> float:
        """When the job's life, as judged, began (class doc)."""
        return self._iterating_since.get(job, self._first_seen.get(job, now))

    def span(self, job: str, now: float) -> float:
        """The time judged: the job's life so far, at least the window, at most the horizon."""
        return min(max(now - self._opened(job, now), self.window_s), self.horizon_s)

    def lag(self, job: str, now: float, load: JobLoad | None) -> float:
        """Time lost to waiting over the span judged, ending now."""
        opened = self._opened(job, now)
        start = now - self.horizon_s
        present = max(now - max(opened, start), 0.0)
        if load is None:
            return present
        # Iterations are counted from when the agent began to track the job, i.e. from its
        # arrival (or the agent's start): the count at the horizon's start is the sample
        # kept at or before it, or 0 when the job arrived within the horizon.
        history = self._history.get(job)
        start_n = 0
        if opened <= start and history and history[0][0] <= start:
            start_n = history[0][1]
        done = max(load.iterations - start_n, 0)
        return max(present - done * load.standalone_period_s, 0.0)

    def remaining(
        self, job: str, now: float, load: JobLoad, declared: int, period: float
    ) -> tuple[float, float]:
        """A job that declared `declared` iterations, of standalone `period` (its model's:
        _periods_by_model): its remaining standalone time and the time left to its deadline
        (class doc), in seconds."""
        deadline = self._first_seen.get(job, now) + self.effective_bound * declared * period
        return (declared - load.iterations) * period, deadline - now

    def remaining_work(
        self, loads: Mapping[str, JobLoad], declared: Mapping[str, int]
    ) -> dict[str, float]:
        """The remaining standalone time of each measured PS job that declared its
        iterations and has not run past them (REMAINING_BUCKET), at its model's period as of
        the last update (model_periods): the jobs pushing the same bytes, whose waiting
        jobs' periods read long (their compute stretched by the wait, 2-5x on real
        frameworks), are so compared by their iterations left. Each at its own, the job
        that took the light would read its remaining work long at once, and hand the light
        back."""
        periods = self.model_periods
        return {
            job: (total - loads[job].iterations) * periods[job]
            for job, total in declared.items()
            if job in periods and job in loads and loads[job].iterations < total
        }

    @property
    def deadline_periods(self) -> dict[str, float]:
        """Jobs judged by their deadline: the period it was reckoned at, when last judged."""
        return {job: self.model_periods[job] for job in self.slack}

    def _periods_by_model(self, loads: Mapping[str, JobLoad], jobs: set[str]) -> dict[str, float]:
        """Each PS job's period its deadline is reckoned with: the shortest `period` read by a
        job pushing its bytes (same_bytes: the same model), itself included (class doc)."""
        periods = {
            job: self.period(job, load)
            for job in jobs
            if (load := loads.get(job)) is not None and load.bytes_hold_waiting
        }
        return {
            job: min(p for other, p in periods.items() if same_bytes(loads[job], loads[other]))
            for job in periods
        }

    def period(self, job: str, load: JobLoad) -> float:
        """The standalone period a job's deadline is reckoned with: the second shortest of the
        readings of its iterations, the latest reading included (class doc)."""
        period = _second_shortest(self._readings_with(job, load).values())
        return load.deadline_period_s if period is None else period

    def _readings_with(self, job: str, load: JobLoad) -> dict[int, float]:
        """The job's kept period readings with the latest one (from its MEASURED_AFTER-th
        iteration on: the first ones' pushes read short)."""
        readings = dict(self._period_readings.get(job, {}))
        if load.iterations >= MEASURED_AFTER:
            latest = load.deadline_period_s
            readings[load.iterations] = min(readings.get(load.iterations, latest), latest)
        return readings

    def _pace(self, job: str) -> float:
        """Seconds an iteration at the job's latest pace: between its last two counts seen."""
        history = self._history.get(job)
        if not history or len(history) < 2:
            return 0.0
        (t0, n0), (t1, n1) = history[-2], history[-1]
        return (t1 - t0) / (n1 - n0) if n1 > n0 else 0.0

    def by_deadline(self, job: str) -> bool:
        """`job` is promoted, judged by its deadline (as of the last update)."""
        return job in self.promoted and job in self.slack

    def young(self, now: float, within_s: float, jobs: set[str]) -> frozenset[str]:
        """Of `jobs`, those that began to push less than `within_s` ago or not yet (a ring:
        that were first measured; as of the last update)."""
        return frozenset(job for job in jobs if now - self._first_seen.get(job, now) < within_s)

    def allowed(self, bound: float, span_s: float) -> float:
        """The lag a span of `span_s` allows at slowdown `bound`."""
        return (1 - 1 / bound) * span_s

    def feasible_bound(self, loads: Mapping[str, JobLoad], jobs: set[str]) -> float:
        """The slowdown bound that can be kept: `max_slowdown`, unless the jobs together
        need more than that many links (sum of demands): then nobody can be kept under it,
        and the guard aims for the sum instead of chasing an impossible bound."""
        total = sum(loads[job].demand for job in jobs if job in loads)
        return max(self.max_slowdown, total)

    def update(
        self,
        now: float,
        loads: Mapping[str, JobLoad],
        jobs: set[str],
        started: Mapping[str, float] | None = None,
        declared: Mapping[str, int] | None = None,
        green: str | None = None,
        alone: bool = True,
        rings: Collection[str] = frozenset(),
    ) -> None:
        """`started`: the jobs that have begun to push, each with when its first push began
        (None: all, from now). A job's span opens when it starts pushing or is measured, not
        when its processes appear: a framework's imports, rendezvous and data loading take
        seconds to minutes, without traffic.
        `declared`: the total iterations of the jobs that declared them (class doc).
        `green`: the job green since the previous update (not_iterative; the sibling a
        job past its limit may wait for, waits_in_time).
        `alone`: this host orders its jobs itself. Under a controller its order is one for
        every host, a job's speed set by all of them, and one host's siblings do not tell
        when the job gets the light: a job waiting in time for its siblings here is still
        promoted (reported starving) and also named in waits_for_siblings, judged afresh at
        every update while past its limit, and the controller keeps it waiting only where
        every host it runs on says so (Registry.starving). Kept waiting by one host's word,
        j3 in the simulator's m3 (promoted on the host it shares with a smaller job, the
        others' sibling on the other) ended at 2.35x.
        `rings`: the collective jobs, whose clocks open when they are first measured (class
        doc)."""
        declared = declared or {}
        for job in list(self._first_seen):
            if job not in jobs:
                del self._first_seen[job]
                self._iterating_since.pop(job, None)
                self._period_readings.pop(job, None)
                self._history.pop(job, None)
                self._green_unmeasured_s.pop(job, None)
                self._active_at.pop(job, None)
                self.promoted.pop(job, None)
        self._judge_iterative(now, loads, green)
        self.effective_bound = self.feasible_bound(loads, jobs)
        candidates: dict[str, float] = {}
        waiting: set[str] = set()
        idle: set[str] = set()
        remaining_s: dict[str, float] = {}  # of the jobs judged by their deadlines
        self.lags, self.spans, self.slack = {}, {}, {}
        for job in jobs:
            load = loads.get(job)
            if load is not None and load.bytes_hold_waiting:
                readings = self._readings_with(job, load)
                shortest = heapq.nsmallest(2, readings.items(), key=lambda reading: reading[1])
                self._period_readings[job] = dict(shortest)
        periods = self.model_periods = self._periods_by_model(loads, jobs)
        for job in sorted(jobs):  # ties among the most behind: by name, not by hash order
            start_up = RING_START_UP_S if job in rings else 0.0
            if started is not None and job in started:
                self._first_seen.setdefault(job, min(started[job], now) + start_up)
            elif started is None or job in loads:
                self._first_seen.setdefault(job, now + start_up)
            load = loads.get(job)
            if load is not None:
                if job not in self._iterating_since:
                    # Not for a job promoted before it completed anything: that was waiting.
                    first = self._first_seen[job]
                    if job in rings:  # first measured now (class doc): not dated back
                        first = self._first_seen[job] = min(first, now)
                    began = now - load.iterations * load.standalone_period_s
                    self._iterating_since[job] = (
                        first if job in self.promoted or job in rings else max(began, first)
                    )
                history = self._history.setdefault(job, deque())
                if not history or history[-1][1] != load.iterations or load.busy:
                    self._active_at[job] = now
                if not history or history[-1][1] != load.iterations:
                    history.append((now, load.iterations))
                # Keep one sample at or before the horizon's start.
                while len(history) > 1 and history[1][0] <= now - self.horizon_s:
                    history.popleft()
            lag = self.lags[job] = self.lag(job, now, load)
            span = self.spans[job] = self.span(job, now)
            total = declared.get(job)
            if (
                load is not None
                and load.bytes_hold_waiting  # a ring's signals do not say it (IDLE_PERIODS)
                and now - self._active_at[job]
                >= max(IDLE_AFTER_S, IDLE_PERIODS * max(load.standalone_period_s, self._pace(job)))
            ):
                idle.add(job)  # stopped or paused: not waiting for the link (IDLE_AFTER_S)
                continue
            if (
                load is not None
                and total is not None
                and load.iterations < total
                and load.bytes_hold_waiting
            ):
                remaining, left = self.remaining(job, now, load, total, periods[job])
                self.slack[job] = left - remaining
                remaining_s[job] = remaining
                if job in self.promoted or remaining > DEADLINE_AT * left:
                    candidates[job] = lag
                continue
            if job in self.not_iterative:
                continue
            limit = PROMOTE_AT * self.allowed(self.effective_bound, span)
            if job in self.promoted and (alone or lag <= limit):
                if lag >= RELEASE_AT * limit:
                    candidates[job] = lag
            elif lag > limit:
                if self.waits_in_time(job, now, loads, jobs, green):
                    waiting.add(job)
                if not alone or job not in waiting:
                    candidates[job] = lag
        self.waits_for_siblings = frozenset(waiting)
        self.idle = frozenset(idle)
        # Those promoted keep their turn (class doc); the others follow, the most behind
        # first. Only as many as fit on the link together are promoted: more would just
        # share the link and all stay behind. A job never measured counts as a whole link.
        # A held job promoted by its deadline gives its turn to one whose slack fell
        # SLACK_SWAP_S below its own (half its remaining time, if less, where the other is
        # due first or the held one in time) and cannot share the link with it. An overdue
        # job never measured goes among those that pass it by the slack it would have as long
        # as the longest of those (class doc).
        demands = {job: loads[job].demand if job in loads else 1.0 for job in candidates}
        held = [job for job in self.promoted if job in candidates]
        slack = dict(self.slack)
        unmeasured = [job for job in candidates if job not in loads]
        if unmeasured and remaining_s:
            longest = max(declared[job] * self.period(job, loads[job]) for job in remaining_s)
            for job in unmeasured:
                slack[job] = (self.effective_bound - 1) * longest - self.lags[job]
        overdue = sorted(
            (job for job in candidates if job not in held and job in slack),
            key=slack.__getitem__,
        )
        passed_by: list[str] = []
        for job in list(held):
            if job not in self.slack:
                continue
            margin = min(SLACK_SWAP_S, remaining_s[job] / 2)
            due_in = self.slack[job] + remaining_s[job]  # the time left to its deadline
            passing = [
                other
                for other in overdue
                if slack[other] < self.slack[job] - margin
                and demands[job] + demands[other] > 1.0
                and (
                    slack[other] < self.slack[job] - SLACK_SWAP_S
                    or self.slack[job] >= 0  # still in time: may end beside the other
                    or other not in remaining_s  # never measured: by its slack alone
                    or slack[other] + remaining_s[other] < due_in
                )
            ]
            if any(other in self.slack for other in passing):
                held.remove(job)
                passed_by += [other for other in passing if other not in passed_by]
        ahead = passed_by + held
        behind = ahead + sorted(
            (job for job in candidates if job not in ahead), key=lambda j: -candidates[j]
        )
        self.promoted = {job: candidates[job] for job in fits_together(behind, demands)}

    def waits_in_time(
        self,
        job: str,
        now: float,
        loads: Mapping[str, JobLoad],
        jobs: set[str],
        green: str | None = None,
    ) -> bool:
        """Whether `job` ends within the bound even if it waits for the job green now to end
        first (every other job here, where it is green itself or none is), all of them
        being its siblings (the same bytes an iteration, appearing within SIBLING_ARRIVAL_S
        of it: the same model launched together) and so taken to run as many iterations N
        as it does, N unknown but at least the most any of them has done. Those it waits for
        run on at the rate they have kept so far (iterations a second since their first
        push), and meanwhile `job` gains what it has gained while waiting (standalone
        seconds a second); then its remaining standalone time must be within SIBLINGS_AT of
        the time left to its deadline, for every such N: the remaining time is convex in N
        and the time left linear, so the least N and the slope cover them all (class doc).
        Only the green one: once it ends, `job` is judged again against the next one green,
        and promoted as soon as it can no longer wait for that one."""
        load = loads.get(job)
        first = self._first_seen.get(job)
        others = jobs - {job}
        if load is None or not load.bytes_hold_waiting or first is None or not others:
            return False
        if now <= first:  # nothing measured of its time yet
            return False
        paces: dict[str, tuple[int, float]] = {}  # each other's iterations done, s per one
        for other in others:
            other_load, other_first = loads.get(other), self._first_seen.get(other)
            if (
                other_load is None
                or other_first is None
                or not other_load.bytes_hold_waiting
                or other_load.iterations <= 0
                or now <= other_first
                or not siblings(first, load.link_s, other_first, other_load.link_s)
            ):
                return False
            paces[other] = (other_load.iterations, (now - other_first) / other_load.iterations)
        least = max([load.iterations, *(done for done, _ in paces.values())])
        waited = [paces[green]] if green in paces else list(paces.values())
        per_iteration = sum(pace for _, pace in waited)  # those waited for, together
        others_s = sum((least - done) * pace for done, pace in waited)
        period = self.period(job, load)
        gained = load.iterations * period / (now - first)
        bound = self.effective_bound
        own = max((least - load.iterations) * period - gained * others_s, 0.0)
        left = first + bound * least * period - now - others_s
        own_slope = max(period - gained * per_iteration, 0.0)
        return own <= SIBLINGS_AT * left and own_slope <= SIBLINGS_AT * (
            bound * period - per_iteration
        )

    def _judge_iterative(self, now: float, loads: Mapping[str, JobLoad], green: str | None) -> None:
        """A job without a load has lag = all its time present, so the lag rule promotes it
        (a job starved from its start has completed nothing to measure). Green, an
        iterative job completes iterations and gets a load within seconds; one that pushed
        and was green MEASURE_GRACE_S without a load is not iterative, and promoted for its
        lag it would keep the light for good (its lag only grows) while the training jobs
        wait behind it."""
        for job in list(self._green_unmeasured_s):
            if job in loads:
                del self._green_unmeasured_s[job]
        previous, self._updated_at = self._updated_at, now
        unmeasured = (
            green
            if green in self._first_seen and green not in loads and self._first_seen[green] < now
            else None
        )
        if unmeasured is not None and previous is not None:
            seconds = self._green_unmeasured_s.get(unmeasured, 0.0) + now - previous
            self._green_unmeasured_s[unmeasured] = seconds
        self.not_iterative = frozenset(
            job for job, seconds in self._green_unmeasured_s.items() if seconds >= MEASURE_GRACE_S
        )


@dataclass
class SiblingRuns:
    """How many iterations the PS jobs that ended here ran. A present job that declared
    nothing, appeared within SIBLING_ARRIVAL_S of one of them and pushes the same bytes an
    iteration (within SIBLING_MATCH: a sweep's trials, the same model launched together) is
    given the length of the latest such, and the starvation guard judges it by that
    deadline as if it had declared it. Judged by its lag alone, a job's past waiting cannot
    tell whether it will still end within the bound: in r2 (three equal jobs) the third
    waited for both others, as under TL-One, and ended at 2.13x (simulated; 2.14x on the
    testbed); given the first one's length when it ended, it is promoted in time (1.94x
    simulated). Matched on the bytes alone, jobs of one model arriving hours apart gave each
    other their lengths: on a simulated cluster day (six models, run times from minutes to
    days) pack's average JCT rose 9.5%. Only a count of every iteration
    (JobLoad.counted_from_start) and a PS job's (a waiting ring's count reads several per
    all-reduce) leave a length. A wrong length errs one of two ways: too short, the job is
    promoted early (the average's cost) and judged by its lag once past it; too long,
    promoted late, as without it."""

    _ended: deque[tuple[float, float, int]] = field(
        default_factory=lambda: deque(maxlen=SIBLINGS_KEPT)
    )
    """(appeared at, link time an iteration, iterations) of the latest jobs that ended."""
    _latest: dict[str, JobLoad] = field(default_factory=dict)
    """Each present job's latest load."""
    _appeared: dict[str, float] = field(default_factory=dict)
    """When each present job first took part in an update."""
    inferred: dict[str, int] = field(default_factory=dict)
    """The length each present job was given, as of the last update."""

    def update(
        self,
        now: float,
        jobs: set[str],
        loads: Mapping[str, JobLoad],
        declared: Mapping[str, int],
    ) -> dict[str, int]:
        """Notes the jobs that ended since (not in `jobs`); returns `declared` with the
        lengths given to the others."""
        for job in [job for job in self._appeared if job not in jobs]:
            appeared = self._appeared.pop(job)
            load = self._latest.pop(job, None)
            if (
                load is not None
                and load.counted_from_start
                and load.bytes_hold_waiting
                and load.iterations > 0
            ):
                self._ended.append((appeared, load.link_s, load.iterations))
        for job in jobs:
            self._appeared.setdefault(job, now)
        self._latest.update((job, load) for job, load in loads.items() if job in jobs)
        self.inferred = {}
        for job, load in loads.items():
            if job in declared or job not in jobs or not load.bytes_hold_waiting:
                continue
            sibling = next(
                (
                    iterations
                    for appeared, link_s, iterations in reversed(self._ended)
                    if siblings(appeared, link_s, self._appeared[job], load.link_s)
                ),
                None,
            )
            if sibling is not None:
                self.inferred[job] = sibling
        return {**declared, **self.inferred}


@dataclass
class OnTop:
    """Iterations each job completed while it was green: measured at its standalone speed."""

    counts: dict[str, int] = field(default_factory=dict)
    _seen: dict[str, int] = field(default_factory=dict)

    def update(self, green: str | None, loads: Mapping[str, JobLoad]) -> None:
        """`green`: the job that was green since the previous update."""
        for job in list(self._seen):
            if job not in loads:
                del self._seen[job]
                self.counts.pop(job, None)
        for job, load in loads.items():
            before = self._seen.get(job)
            if job == green and before is not None:
                self.counts[job] = self.counts.get(job, 0) + max(load.iterations - before, 0)
            self._seen[job] = load.iterations


def same_bytes(load: JobLoad, other: JobLoad) -> bool:
    """Two jobs push the same bytes an iteration, within DEMAND_BUCKET (the same model)."""
    return (
        load.link_s <= other.link_s * DEMAND_BUCKET and other.link_s <= load.link_s * DEMAND_BUCKET
    )


def ordering_demands(
    loads: Mapping[str, JobLoad],
    on_top: Mapping[str, int],
    top: str | None,
    trust_top: bool = True,
    declared: Collection[str] = frozenset(),
) -> dict[str, float]:
    """The demands pack orders by (module doc): those resting on MEASURED_AFTER iterations,
    of `top` (the green job: measured where it is; unless not `trust_top`) and of jobs
    measured that long on top; and those resting on SMALLER_AFTER, of jobs pushing clearly
    fewer bytes than `top` (where their bytes can be believed while they wait:
    `JobLoad.bytes_hold_waiting`), and then `top`'s own on SMALLER_AFTER iterations (where
    `trust_top`); and, for a waiting job of `declared` (the jobs that declared their
    iterations), the demand of one of those above that declared too and whose bytes it
    pushes, `top` first (the module doc)."""
    top_load = loads.get(top) if top is not None else None
    # What a waiting job's reading is compared with to show it smaller: `top`'s, once it
    # rests on SMALLER_AFTER pushes (nothing before).
    top_link_s = (
        top_load.link_s
        if top_load is not None and top_load.pushes_in_reading >= SMALLER_AFTER
        else -math.inf
    )
    demands = {}
    any_smaller = False
    for job, load in loads.items():
        smaller = (
            load.pushes_in_reading >= SMALLER_AFTER
            and load.bytes_hold_waiting
            and load.link_s * DEMAND_BUCKET <= top_link_s
        )
        any_smaller |= smaller
        trusted = (trust_top and job == top) or on_top.get(job, 0) >= MEASURED_AFTER
        if smaller or (trusted and load.iterations >= MEASURED_AFTER):
            demands[job] = load.demand
    # A job shown clearly smaller than `top` by its bytes passes it whatever `top`'s demand
    # settles at: `top`'s, on SMALLER_AFTER iterations, places it among the others meanwhile.
    # Not where `top` is not trusted (a follower's report to the controller): simulated,
    # controller-pack's r3 found large-small-medium took 13.03 -> 13.49 s with it.
    if (
        trust_top
        and any_smaller
        and top is not None
        and top_load is not None
        and top not in demands
        and top_load.iterations >= SMALLER_AFTER
    ):
        demands[top] = top_load.demand
    # A waiting job that declared its length and pushes the bytes of a declaring job whose
    # demand orders it (the same model; the top job's first) joins that job's group, where
    # the least remaining work goes first.
    anchors = sorted((job for job in demands if job in declared), key=lambda job: job != top)
    for job in declared:
        waiting = loads.get(job)
        if job in demands or waiting is None or not waiting.bytes_hold_waiting:
            continue
        anchor = next((a for a in anchors if same_bytes(waiting, loads[a])), None)
        if anchor is not None:
            demands[job] = demands[anchor]
    return demands


def link_work_left(loads: Mapping[str, JobLoad], declared: Mapping[str, int]) -> dict[str, float]:
    """The link time each PS job that declared its iterations has left to push (iterations
    left x its bytes' link time), on SMALLER_AFTER pushes: what orders held jobs among
    themselves (pack_order). A waiting job's bytes hold where its period does not (read long
    below another job), and with its length they tell the work it has left; bytes alone
    do not (jobs of one model run minutes to days): sorted by bytes alone, the simulated
    cluster day's average rose 2% (docs/benchmarks.md). Jobs pushing the same bytes
    (same_bytes) are reckoned at the shortest link time any of them read, so compared by
    their iterations left, as in remaining_work: the same model's readings vary by a
    fifth and more while it waits."""
    known = {
        job: load
        for job, total in declared.items()
        if (load := loads.get(job)) is not None
        and load.bytes_hold_waiting
        and SMALLER_AFTER <= load.iterations < total
    }
    return {
        job: (declared[job] - load.iterations)
        * min(other.link_s for other in known.values() if same_bytes(load, other))
        for job, load in known.items()
    }


def pack_order(
    order: Sequence[str],
    demands: Mapping[str, float],
    promoted: Mapping[str, float],
    end_times: Mapping[str, float] | None = None,
    holding: frozenset[str] = frozenset(),
    hosts: Mapping[str, Collection[str]] | None = None,
    remaining: Mapping[str, float] | None = None,
    held_work: Mapping[str, float] | None = None,
) -> list[str]:
    """Green first: promoted, in `promoted`'s order (their turns: StarvationGuard.promoted),
    measured jobs by demand, then unmeasured. `order` is the order in force (arrival order the
    first time): demands within x1.3 of a group's smallest count as equal, and within a group
    jobs whose resource manager says when they end (`end_times`, e.g. Slurm time limits) go
    first, the soonest first (shortest remaining time); then, where every job of the group has
    its `remaining` standalone time (declared iterations: StarvationGuard.remaining_work), the
    least first, within REMAINING_BUCKET as equal; the others keep their place in `order`. With
    `hosts` (the controller's order, one for many hosts: each job's hosts), a job of a group
    that shares no host with a promoted or measured job ranked ahead of it goes before those of
    its group that do (free_first). Unmeasured jobs in `holding` (young ones, still being
    measured) keep their place too: a job is not put behind and then ahead again while its first
    iterations are measured, and does not displace a measured one -- each comes right behind the
    last (in demand order) of the measured jobs that were ahead of it in `order`, ahead of those
    that were behind it. Held jobs that come behind the same one keep their order among them
    too, unless each has its `held_work` (link_work_left): then the least first, within
    REMAINING_BUCKET as equal."""
    ends = end_times or {}
    position = {job: i for i, job in enumerate(order)}

    def within(job: str, bucket: Mapping[str, float] | None = None) -> tuple[float, float, int]:
        return (ends.get(job, math.inf), (bucket or {}).get(job, 0.0), position[job])

    # Not re-sorted by lag: two promoted jobs that fit together traded the top band as
    # their lags crossed, four times in 3 s in (f) (results/bench-synthetic-table-1207).
    first = [job for job in promoted if job in position]
    rest = [job for job in order if job not in promoted]
    groups: dict[float, list[str]] = {}  # by the group's smallest demand, smallest first
    for job, least in buckets({j: demands[j] for j in rest if j in demands}, DEMAND_BUCKET):
        groups.setdefault(least, []).append(job)
    by_demand: list[str] = []
    taken = {host for job in first for host in (hosts or {}).get(job, ())}
    left = remaining or {}
    for group in groups.values():
        # The least remaining work first, where every job of the group declared it.
        bucket = None
        if all(job in left for job in group):
            bucket = dict(buckets({job: left[job] for job in group}, REMAINING_BUCKET))
        ranked = sorted(group, key=lambda j: within(j, bucket))
        by_demand += ranked if hosts is None else free_first(ranked, hosts, taken)
    rank = {job: i for i, job in enumerate(by_demand)}
    # A held job sorts right behind the last-ranked measured job that was ahead of it (-1:
    # none), after the held jobs that were ahead of it too (that rank only grows along
    # `order`).
    behind = -1
    keys: dict[str, tuple[int, int]] = {job: (i, 0) for i, job in enumerate(by_demand)}
    alike: dict[int, list[str]] = {}  # held jobs by the measured job they come behind
    for job in rest:
        if job in demands:
            behind = max(behind, rank[job])
        elif job in holding:
            keys[job] = (behind, 1 + position[job])
            alike.setdefault(behind, []).append(job)
    work = held_work or {}
    for alike_held in alike.values():
        # The green job keeps its place: a waiting one passes it only by its demand.
        held = [job for job in alike_held if job != order[0]]
        if len(held) > 1 and all(job in work for job in held):
            by_work = dict(buckets({job: work[job] for job in held}, REMAINING_BUCKET))
            ranked = sorted(held, key=lambda j: (by_work[j], position[j]))
            slots = sorted(keys[job] for job in held)
            keys.update(zip(ranked, slots, strict=True))
    middle = sorted(keys, key=keys.__getitem__)
    last = sorted((job for job in rest if job not in demands and job not in holding), key=within)
    return first + middle + last


def buckets(values: Mapping[str, float], factor: float) -> list[tuple[str, float]]:
    """`values` smallest first, each with the least value of its bucket: a bucket holds every
    value within `factor` of its least (demands within DEMAND_BUCKET, remaining work within
    REMAINING_BUCKET: equal to within measurement noise)."""
    ranked: list[tuple[str, float]] = []
    least: float | None = None
    for key in sorted(values, key=values.__getitem__):
        if least is None or values[key] > least * factor:
            least = values[key]
        ranked.append((key, least))
    return ranked


def free_first(
    jobs: Sequence[str], hosts: Mapping[str, Collection[str]], taken: set[str]
) -> list[str]:
    """`jobs` (equal demands, in their order) with those that share no host with `taken` (the
    hosts of the jobs ranked ahead, which grows by theirs) and with none put before them
    first; the others after them, in their order. Such a job is green on all its hosts; one
    behind a job ahead on some host is held back there, so being first on its other hosts
    gains it little and costs the job it goes ahead of its speed. The order in force put m3's
    j1 (sharded over ps and ps2, behind the smaller j4 on ps) ahead of j2 on ps2: j2 waited
    behind it, where j2 and j4, sharing no host, could both run alone (simulator: 45.02 ->
    40.32 s average, the largest slowdown 2.21 as before). Applied to its own result it
    changes nothing, so the light does not move for it while the jobs and their demands
    stay."""
    free: list[str] = []
    held: list[str] = []
    for job in jobs:
        where = hosts.get(job, ())
        if taken.isdisjoint(where):
            free.append(job)
            taken.update(where)
        else:
            held.append(job)
    for job in held:
        taken.update(hosts.get(job, ()))
    return free + held


def fits_together(order: Sequence[str], demands: Mapping[str, float]) -> list[str]:
    """The prefix of `order` whose demands fit on the link together (it ends at the first
    job without one)."""
    group: list[str] = []
    total = 0.0
    for job in order:
        demand = demands.get(job)
        if demand is None or total + demand > 1.0:
            break
        group.append(job)
        total += demand
    return group


def measured_beside(
    order: Sequence[str],
    bands: Mapping[str, int],
    loads: Mapping[str, JobLoad],
    ordered: Collection[str],
    young: Collection[str],
    declared: Mapping[str, int],
) -> dict[str, int]:
    """`bands`, with each young job not ordered yet (not in `ordered`, the jobs whose demand
    orders them) that declared clearly fewer iterations than the green one (`order[0]`,
    measured and declaring) has left (REMAINING_BUCKET) in the band of the last measured job
    ahead of it, the green one aside: its first iterations interleave with that job's pushes
    instead of waiting below them, until its length can put it first (module doc). Its place
    in the order stays."""
    shared = dict(bands)
    top = order[0] if order else None
    top_load = loads.get(top) if top is not None else None
    if top is None or top not in declared or top_load is None:
        return shared
    top_left = declared[top] - top_load.iterations
    beside: int | None = None
    for job in order[1:]:
        if (
            beside is not None
            and job not in ordered
            and job in young
            and job in declared
            and declared[job] * REMAINING_BUCKET < top_left
        ):
            shared[job] = beside
        elif job in loads:
            beside = bands[job]
    return shared
