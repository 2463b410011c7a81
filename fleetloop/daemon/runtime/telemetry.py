"""Stats and telemetry: what the daemon counts (:class:`DaemonStats`, read by ``/healthz``, the
benches and the tests, and logged at the stop), where its consumer loop's time goes
(:class:`LoopTimes`, the "loop" line), and when each stage of a tripping breaker's way out happened
(:class:`TripTrace`, the "trip path" line). Observation only: nothing here changes a decision.

The OpenTelemetry instruments are :mod:`fleetloop.daemon.service.metrics`; the parts record on them
where things happen.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import sys
import threading
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, Protocol, TypeVar

from fleetloop import clock as wall_clock
from fleetloop.daemon.observability import logger
from fleetloop.daemon.runtime.port import Clock

log = logger("fleetloop.daemon")


@dataclass(slots=True)
class DaemonStats:
    events_in: int = 0
    telemetry_in: int = 0
    outcomes_in: int = 0
    ticks_in: int = 0
    ticks_decided: int = 0
    summaries_published: int = 0
    ticks_restored: int = 0  # decided again after a restore to rebuild state, not republished
    ticks_no_data: int = 0
    ticks_forced: int = 0
    ticks_duplicate: int = 0
    ticks_skipped: int = 0  # boundaries published as skipped (an outage beyond the catch-up)
    ticks_failed: int = 0  # ticks whose decision raised: published as skipped with the reason
    fold_steps: int = 0  # far cuts' folds split with a yield after each step (FOLD_STEP_ROWS)
    last_tick_failure: str = ""
    dead_letters_lost: int = 0  # dead letters the broker refused to take (counted, logged)
    dead_letters_suppressed: int = 0  # not published again after a restore: published before
    dead_letter_scans: int = 0  # reads of the dead-letter topic at a restore: one per assignment
    dead_letter_marks_lost: int = 0  # restored shards whose dead-letter range retention removed
    ticks_caught_up: int = 0  # missed boundaries this instance's ticker published late
    ticks_catchup_capped: int = 0  # missed boundaries published as skipped: beyond catchup_budget_s
    ticks_overload: int = 0  # boundaries this instance's ticker published as skipped: overload
    overload_episodes: int = 0  # times a shard of this instance went into overload
    dead_letters: int = 0
    decisions_published: int = 0
    breaker_opens: int = 0
    policies_applied: int = 0
    policies_refused: int = 0
    shadow_decisions: int = 0  # decisions of the shadow policy published to control.shadow
    shadow_failed: int = 0  # ticks the shadow policy could not decide (the enforced ones were)
    commits: int = 0
    commits_skipped: int = 0  # batches that moved no offset since the last commit: none sent
    checkpoints_written: int = 0
    checkpoint_bytes: int = 0  # the largest shard's checkpoint last written, compressed
    checkpoint_loop_ms: float = 0.0  # time the loop spent starting the last checkpoint (the fork)
    checkpoint_encode_s: float = 0.0  # time from that start to the encoded bytes (in the child)
    checkpoint_cpu_s: float = 0.0  # the CPU the last checkpoint's child used (its own, not in /proc's)
    checkpoint_cpu_s_total: float = 0.0  # ... and every checkpoint's since the start
    checkpoint_gap_s: float = 0.0  # how often a changed shard is checkpointed now (checkpoint.gap_s)
    checkpoint_decode_s: float = 0.0  # the last assignment's checkpoint decoding (in a thread)
    shards_restored: int = 0
    shards_started_clean: int = 0
    last_decision_ts_ms: int = 0  # the newest tick whose decisions the broker acknowledged
    # Stability at scale, since the start: the longest the event loop went without running a
    # callback it had due (StallWatch: heartbeats, the ticker and the fetches wait that long), the
    # longest cyclic-GC pause (gc.callbacks: process-wide, the loop waits through it), and how often
    # the group handed this instance partitions (the first assignment, then one per rebalance).
    loop_stall_max_ms: float = 0.0
    gc_pause_max_ms: float = 0.0
    assignments: int = 0
    # ... and the same two without the time the loop's thread was runnable but not run (the
    # machine's other work had the cores): what the daemon's own work made of them. On a machine
    # with a core to spare the two agree; on a starved one the wall figures are the machine's.
    loop_stall_own_max_ms: float = 0.0
    gc_pause_own_max_ms: float = 0.0
    # The longest stalls of the loop's own time since the start (at most STALLS_KEPT, at least
    # STALL_NOTE_MS each), with what the loop's thread ran meanwhile (StallSampler): where the
    # time went, for the "daemon stopped" line and the benches.
    stalls_top: list[Stall] = field(default_factory=list)
    dead_by_reason: dict[str, int] = field(default_factory=dict)  # reason kind -> dead letters
    last_refusal: str = ""
    breaker_open_nodes: set[str] = field(default_factory=set)

    def summary(self) -> dict[str, int]:
        """The figures of the "daemon stopped" line."""
        return {
            "events_in": self.events_in,
            "ticks_decided": self.ticks_decided,
            "ticks_restored": self.ticks_restored,
            "ticks_caught_up": self.ticks_caught_up,
            "ticks_skipped": self.ticks_skipped,
            "ticks_overload": self.ticks_overload,
            "ticks_catchup_capped": self.ticks_catchup_capped,
            "overload_episodes": self.overload_episodes,
            "decisions_published": self.decisions_published,
            "dead_letters": self.dead_letters,
            "breaker_opens": self.breaker_opens,
            "commits": self.commits,
            "commits_skipped": self.commits_skipped,
            "checkpoints_written": self.checkpoints_written,
            "checkpoint_cpu_ms": round(self.checkpoint_cpu_s_total * 1000.0),
            "loop_stall_max_ms": round(self.loop_stall_max_ms),
            "gc_pause_max_ms": round(self.gc_pause_max_ms),
            "loop_stall_own_max_ms": round(self.loop_stall_own_max_ms),
            "gc_pause_own_max_ms": round(self.gc_pause_own_max_ms),
            "assignments": self.assignments,
        }

    def note_stall(self, stall: Stall) -> None:
        """Keep ``stall`` among the longest (``STALLS_KEPT``, by the loop's own time)."""
        if stall.own_ms < STALL_NOTE_MS:
            return
        top = self.stalls_top
        if len(top) >= STALLS_KEPT and stall.own_ms <= top[-1].own_ms:
            return
        top.append(stall)
        top.sort(key=lambda x: -x.own_ms)
        del top[STALLS_KEPT:]

    def stalls_shown(self) -> str:
        """The longest stalls as one token (no spaces, so a console log line keeps it whole):
        ``own/wall ms@where`` each, longest first, ``;`` between; "none" when none was noted."""
        return ";".join(x.shown() for x in self.stalls_top) or "none"

    def stability(self) -> dict[str, float]:
        """The stability figures (loop stall, GC pause, assignments): for ``/metrics`` and the benches."""
        return {
            "loop_stall_max_ms": round(self.loop_stall_max_ms, 1),
            "gc_pause_max_ms": round(self.gc_pause_max_ms, 1),
            "loop_stall_own_max_ms": round(self.loop_stall_own_max_ms, 1),
            "gc_pause_own_max_ms": round(self.gc_pause_own_max_ms, 1),
            "assignments": self.assignments,
        }


STALL_NOTE_MS = 50.0  # a stall of at least this much of the loop's own time is kept with what ran
STALLS_KEPT = 5  # ... the longest this many since the start


@dataclass(frozen=True, slots=True)
class Stall:
    """One loop stall: the loop's own milliseconds of it (without its thread's wait for a core),
    its wall milliseconds, and where: what the loop's thread ran meanwhile (the code the
    :class:`StallSampler` found most often, innermost first, with the runtime's frame that called
    it), ``+gcN`` when collector pauses took N ms of it; "" when nothing was sampled."""

    own_ms: float
    wall_ms: float
    where: str

    def shown(self) -> str:
        return f"{self.own_ms:.0f}/{self.wall_ms:.0f}ms@{self.where or '?'}"


LOOP_REPORT_S = 30.0  # how often the daemon logs where its consumer loop's time went ("loop")


@dataclass(slots=True)
class LoopTimes:
    """Where the consumer loop's wall time goes, by what it was doing or waiting on: per phase the
    wall seconds, and of them the seconds the loop's thread ran (``cpu``) and was runnable but not
    run (``runq``: the machine's other work had the cores, :func:`clock.thread_sched_s`); the rest
    is time the loop waited on something (the broker, a fetch with nothing to do). A daemon behind
    its boundaries that waits rather than computes, or is not run, shows it here.

    Phases (each :meth:`lap` gives the time since the previous one to its phase): ``fetch`` (a fetch
    with ticks queued: their cuts' records on the way), ``fetch_in_flight`` (no tick queued, but
    ticks this instance published are not read back yet: the broker's round trip),
    ``fetch_idle`` (a fetch with no tick queued or in flight: every published boundary decided, the
    next one not yet due), ``fetch_held_back`` (the same while the ticker holds pools back for
    overload, which :meth:`Ticker.wake_held_back` ends), ``read`` (decode into the shards),
    ``decide`` (folding, deciding and staging; the ticker's and the client's turns between batches
    included; the collector held, :class:`CollectorHold`), ``collect`` (a young collection the
    decide held back, when one came due at its end), ``acks`` (waiting for the broker to
    acknowledge the decisions), ``summaries``, ``dead_letters``, ``checkpoint``, ``commit``,
    ``restore``, ``loop`` (the rest).
    ``ticker_late_s``: the latest the ticker woke after a boundary; ``ticker_s``: the ticker's
    rounds (reads awaited, ticks sent and acknowledged)."""

    wall_s: dict[str, float] = field(default_factory=dict)
    cpu_s: dict[str, float] = field(default_factory=dict)
    runq_s: dict[str, float] = field(default_factory=dict)
    mark: tuple[float, float, float] = (0.0, 0.0, 0.0)  # (monotonic, cpu, runq) at the last lap
    since_s: float = 0.0  # monotonic start of the current report window
    ticker_late_s: float = 0.0
    ticker_s: float = 0.0
    # The cyclic collector's pauses (``gc.callbacks``, process-wide: the loop waits through each):
    # seconds in all, the longest one, and how many were full (generation 2) collections.
    gc_s: float = 0.0
    gc_max_s: float = 0.0
    gc_full: int = 0
    gc_started: float = 0.0
    gc_runq: float = 0.0
    freeze_due: bool = False  # a collection ended: what survived it is frozen next (freeze_survivors)
    stall_max_s: float = 0.0  # the longest loop stall in the window (StallWatch)
    stall_own_max_s: float = 0.0  # ... without its thread's wait for a core
    stall_where: str = ""  # ... and what ran in the window's longest (own) stall
    gc_total_s: float = 0.0  # the collector's pauses since the start (what a stall's share is read from)
    gc_at_stall_s: float = 0.0  # gc_total_s at the last on_stall
    stats: DaemonStats | None = field(default=None, repr=False)  # lifetime maxima go here too
    clock: Clock = field(default=wall_clock, repr=False)

    def on_gc(self, phase: str, info: Mapping[str, Any]) -> None:
        """A ``gc.callbacks`` entry: time each collection."""
        now = self.clock.monotonic_s()
        runq = self.clock.thread_sched_s()[1] if self.stats is not None else 0.0
        if phase == "start":
            self.gc_started, self.gc_runq = now, runq
            return
        if not self.gc_started:
            return
        took = now - self.gc_started
        self.gc_started = 0.0
        self.freeze_due = True
        self.gc_s += took
        self.gc_total_s += took
        self.gc_max_s = max(self.gc_max_s, took)
        if self.stats is not None:
            own = max(0.0, took - (runq - self.gc_runq))
            self.stats.gc_pause_max_ms = max(self.stats.gc_pause_max_ms, took * 1000.0)
            self.stats.gc_pause_own_max_ms = max(self.stats.gc_pause_own_max_ms, own * 1000.0)
        if info.get("generation") == 2:
            self.gc_full += 1

    def lap(self, phase: str) -> None:
        """Give the time since the previous lap to ``phase``."""
        now = self.clock.monotonic_s()
        cpu, runq = self.clock.thread_sched_s()
        w0, c0, r0 = self.mark
        if w0:
            self.wall_s[phase] = self.wall_s.get(phase, 0.0) + (now - w0)
            self.cpu_s[phase] = self.cpu_s.get(phase, 0.0) + (cpu - c0)
            self.runq_s[phase] = self.runq_s.get(phase, 0.0) + (runq - r0)
        self.mark = (now, cpu, runq)

    def report(self) -> dict[str, Any] | None:
        """The window's figures once ``LOOP_REPORT_S`` passed (then a new window), else None: per
        phase "wall/cpu/runq" seconds, and the totals."""
        now = self.clock.monotonic_s()
        if self.since_s == 0.0:
            self.since_s = now
            return None
        span = now - self.since_s
        if span < LOOP_REPORT_S:
            return None
        wall, cpu, runq = (sum(d.values()) for d in (self.wall_s, self.cpu_s, self.runq_s))
        out: dict[str, Any] = {
            "window_s": round(span, 1),
            "cpu_s": round(cpu, 2),
            "runq_s": round(runq, 2),
            "waiting_s": round(max(0.0, wall - cpu - runq), 2),
            **{
                k: f"{v:.2f}/{self.cpu_s[k]:.2f}/{self.runq_s[k]:.2f}" for k, v in sorted(self.wall_s.items())
            },
            "ticker_late_s": round(self.ticker_late_s, 2),
            "ticker_s": round(self.ticker_s, 2),
            "gc_s": round(self.gc_s, 3),
            "gc_max_s": round(self.gc_max_s, 3),
            "gc_full": self.gc_full,
            "stall_max_s": round(self.stall_max_s, 3),
            "stall_own_max_s": round(self.stall_own_max_s, 3),
            "stall_where": self.stall_where or "none",
        }
        self.wall_s, self.cpu_s, self.runq_s = {}, {}, {}
        self.since_s = now
        self.ticker_late_s = self.ticker_s = 0.0
        self.gc_s = self.gc_max_s = self.stall_max_s = self.stall_own_max_s = 0.0
        self.gc_full = 0
        self.stall_where = ""
        return out

    def on_stall(self, stalled_s: float, own_s: float, where: str = "") -> None:
        """The loop ran a due callback ``stalled_s`` late, ``own_s`` of it not counting the time its
        thread waited for a core, ``where`` what its thread ran meanwhile (:class:`StallWatch`)."""
        gc_ms = (self.gc_total_s - self.gc_at_stall_s) * 1000.0  # collector pauses since the last call
        self.gc_at_stall_s = self.gc_total_s
        if gc_ms >= 1.0 and stalled_s * 1000.0 >= STALL_NOTE_MS:
            where = f"{where}+gc{gc_ms:.0f}" if where else f"gc{gc_ms:.0f}"
        self.stall_max_s = max(self.stall_max_s, stalled_s)
        if own_s > self.stall_own_max_s:
            self.stall_where = where
        self.stall_own_max_s = max(self.stall_own_max_s, own_s)
        if self.stats is not None:
            self.stats.note_stall(Stall(round(own_s * 1000.0, 1), round(stalled_s * 1000.0, 1), where))
            self.stats.loop_stall_max_ms = max(self.stats.loop_stall_max_ms, stalled_s * 1000.0)
            self.stats.loop_stall_own_max_ms = max(self.stats.loop_stall_own_max_ms, own_s * 1000.0)


STALL_PROBE_S = 0.02  # how often StallWatch asks the loop for a turn


# How often the StallSampler looks whether the loop is late. Each look takes the interpreter
# from a busy loop thread, which waits until the sampler's thread gets a core: rarely, so a
# loaded machine does not stall the loop for it; a stall of 100 ms is still sampled at least once.
STALL_SAMPLE_S = 0.05
STALL_SAMPLE_AFTER_S = 0.03  # ... and samples its thread's code once it is this late


_MEASURING = frozenset({"fleetloop.clock", __name__})


def where_of(frame: FrameType | None) -> str:
    """Where a thread is, as one token: its two innermost frames of fleetloop's code (module and
    function, ``core.model.fold._fold_outcome``), innermost first, and the runtime's frame that
    called them (``daemon.runtime.decider._decide_batch``) after ``<``; with no fleetloop frame,
    the innermost frame's file and function (a client library's, asyncio's)."""
    names: list[str] = []
    first = ""
    f = frame
    while f is not None:
        code = f.f_code
        if not first:
            first = f"{os.path.basename(code.co_filename)}:{code.co_name}"
        module = str(f.f_globals.get("__name__", ""))
        # The measuring itself (a collector callback timing a pause, reading the clock) is not
        # what stalled the loop: the code it interrupted is.
        if module.startswith("fleetloop.") and module not in _MEASURING:
            names.append(f"{module[10:]}.{code.co_name}")
        f = f.f_back
    if not names:
        return first
    shown = names[:2]
    runtime = next((n for n in names if n.startswith("daemon.runtime.")), None)
    if runtime is not None and runtime not in shown:
        shown.append(runtime)
    return "<".join(shown)


class StallSampler:
    """What the loop's thread runs while the loop is late: a thread that looks every
    ``STALL_SAMPLE_S`` whether the :class:`StallWatch` has waited more than
    ``STALL_SAMPLE_AFTER_S`` for its turn, and if so takes the loop thread's current frame
    (:func:`where_of`). The watch takes the most sampled place when it gets its turn: a stall comes
    with its culprit. Built on the loop's thread. A collector pause holds the interpreter, so it is
    not sampled; :meth:`LoopTimes.on_stall` adds its share. Observation only."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.thread_id = threading.get_ident()
        self.asked = 0.0  # when the watch asked the loop for a turn; 0: not waiting
        self._seen: Counter[str] = Counter()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="fleetloop-stall-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(STALL_SAMPLE_S):
            asked = self.asked
            if asked and self.clock.monotonic_s() - asked > STALL_PROBE_S + STALL_SAMPLE_AFTER_S:
                frame = sys._current_frames().get(self.thread_id)
                self._seen[where_of(frame)] += 1
                del frame

    def take(self) -> str:
        """The place sampled most often since the last take ("" when none was)."""
        seen, self._seen = self._seen, Counter()
        top = seen.most_common(1)
        return top[0][0] if top else ""


class StallWatch:
    """How long the event loop goes without running what it has due: a task that sleeps
    ``STALL_PROBE_S`` over and over and reports how much later than asked it woke (a loop stall:
    a long synchronous step, a GC pause, the GIL held by a thread), with what the loop's thread ran
    meanwhile when a ``sampler`` watches it. aiokafka's heartbeats are a task on this loop too, so a
    stall is how late they are; a stall past the session timeout is a rebalance. Observation only."""

    def __init__(
        self,
        clock: Clock,
        on_stall: Callable[[float, float, str], None],
        sampler: StallSampler | None = None,
    ) -> None:
        self.clock = clock
        self.on_stall = on_stall
        self.sampler = sampler

    async def run(self, stop: asyncio.Event) -> None:
        clock = self.clock
        sampler = self.sampler
        if sampler is not None:
            sampler.start()
        try:
            while not stop.is_set():
                asked, runq0 = clock.monotonic_s(), clock.thread_sched_s()[1]
                if sampler is not None:
                    sampler.asked = asked
                await asyncio.sleep(STALL_PROBE_S)
                late = max(0.0, clock.monotonic_s() - asked - STALL_PROBE_S)
                where = ""
                if sampler is not None:
                    sampler.asked = 0.0
                    where = sampler.take()
                # Of it, the time the loop's thread waited for a core is the machine's, not the loop's.
                self.on_stall(late, max(0.0, late - (clock.thread_sched_s()[1] - runq0)), where)
        finally:
            if sampler is not None:
                sampler.stop()


TRACE_BOUNDARIES = 16  # boundaries whose stage times the trace keeps (the oldest go first)


@dataclass(slots=True)
class TripTrace:
    """When each stage of a tripping breaker's way out happened after its tick boundary: one
    "trip path" log line per boundary at which a shard decided a pool with a failed call among the
    records its cut folds (``Shard.troubled``: decided first, :meth:`Decider.decide_ready`), in
    milliseconds after the boundary. The stages, in order: ``woke`` (the ticker woke for the
    boundary), ``read_up`` (its read-up-to-now wait ended, :meth:`Ticker.read_to_now`),
    ``ticks_acked`` (every tick of the boundary acknowledged by the broker), ``ticks_read`` (the
    loop read the tripping pool's tick back), ``cut_ready`` (the loop started deciding it: its
    cut's records read), ``folded`` (the shard folded up to the cut), ``decided``, ``staged`` (its
    decisions handed to the publisher), ``acked`` (the broker acknowledged them). What a boundary
    did not reach is left out. Observation only: nothing is decided or published differently."""

    marks: dict[int, dict[str, int]] = field(default_factory=dict)  # boundary -> stage -> wall ms
    trips: set[int] = field(default_factory=set)  # boundaries with a trip staged, not yet acked
    clock: Clock = field(default=wall_clock, repr=False)

    def stamp(self, boundary: int, stage: str, at_ms: int | None = None) -> None:
        """Note ``stage`` of ``boundary`` now (or at ``at_ms``): the first time only."""
        marks = self.marks.get(boundary)
        if marks is None:
            while len(self.marks) >= TRACE_BOUNDARIES:
                old = min(self.marks)
                del self.marks[old]
                self.trips.discard(old)
            marks = self.marks[boundary] = {}
        marks.setdefault(stage, self.clock.wall_ms() if at_ms is None else at_ms)

    def after(self, boundary: int) -> dict[str, int]:
        """Each noted stage of ``boundary`` in milliseconds after it."""
        return {k: v - boundary for k, v in self.marks.get(boundary, {}).items()}

    def acked(self) -> None:
        """The broker acknowledged what was staged: one "trip path" line per boundary whose
        tripping pools' decisions were among it."""
        for boundary in sorted(self.trips):
            self.stamp(boundary, "acked")
            log.info("trip path", boundary=boundary, **self.after(boundary))
        self.trips.clear()


@contextlib.contextmanager
def gc_held(tuned: bool) -> Iterator[None]:
    """No cyclic collection while a large state is built (a restore decodes whole shards: hundreds
    of thousands of objects, each batch of new ones a young collection, and the growth a full one
    over the whole heap: 0.7 s at 10,000 nodes on a loaded machine), then what exists is moved out
    of the collector's sight for good (:func:`gc.freeze`): a restored shard lives as long as its
    partition stays, and a full collection walking it found nothing to free. Only where the daemon
    tunes the collector (``tuned``; the tests share the process and leave it alone). Reference
    counting frees as ever meanwhile; a cycle made in that time is kept."""
    if not tuned or not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()


T = TypeVar("T")


class CollectorHold:
    """The cyclic collector held while a boundary is folded and decided, its young collections run
    between the decider's steps instead: a collection that fired inside a batch's decide walked what
    the decide had alive at that moment (the shared snapshot's columns, the sections' scratch) and
    stalled the loop in the middle of the batch; held, that scratch is freed by reference counting
    before any collection looks. No more collections than the threshold makes: at each of the
    decider's turns (after a fold step, after a batch's decisions are staged: :meth:`relieve`) and
    at the end of the hold (:meth:`release`), young objects are collected once there are more than
    ``gen0_threshold`` of them, what the collector would have done by then; so no collection here
    walks more than the threshold's worth and one step's, and none runs inside a step. Only where
    the daemon tunes the collector (``gen0_threshold`` > 0; the tests share the process and leave
    it alone) and only when it is enabled.

    Each collection is still a pause of the loop: it runs in the loop's thread with the collector's
    callbacks installed (:meth:`LoopTimes.on_gc` times it, :class:`StallWatch` sees it as a stall,
    with the step that follows it when no timer came between). After every collection here what
    survived is frozen (:func:`freeze_survivors`' reason), the young generation being empty then.
    Reference counting frees as ever meanwhile; a cycle made while held lives until the next
    collection."""

    def __init__(self, gen0_threshold: int) -> None:
        self.tuned = gen0_threshold > 0
        self.threshold = gen0_threshold
        self.holding = False
        self.collections = 0  # collections run here (at the end of a hold, or to relieve one)

    def hold(self) -> None:
        """Hold the collector (nothing when not tuned, already held or disabled by someone else)."""
        if self.tuned and not self.holding and gc.isenabled():
            gc.disable()
            self.holding = True

    def release(self) -> None:
        """Let the collector run again, and collect young objects now when they are past the
        threshold (the collection the hold put off)."""
        if not self.holding:
            return
        self.holding = False
        gc.enable()
        if gc.get_count()[0] > self.threshold:
            self._collect()

    def relieve(self) -> bool:
        """At a turn of the loop while held: collect once the young generation is past the
        threshold; True when it did (the caller gives the loop a turn before going on)."""
        if self.holding and gc.get_count()[0] > self.threshold:
            self._collect()
            return True
        return False

    async def unheld(self, aw: Awaitable[T]) -> T:
        """``await aw`` with the collector running as usual, then held again: while the decider
        awaits (a turn of the loop, the client's staging, a broker round trip), the other tasks
        (the consumer's fetches, the client's sends, the ticker) allocate as ever, and held, their
        survivors would pile up for one long collection at the next turn (a 10,000-node daemon's
        collector took 183 ms of its own time after a round trip held so). Let go, they are
        collected as they come, at the threshold, as before the hold; a decide step, synchronous,
        still runs held."""
        if not self.holding:
            return await aw
        gc.enable()
        try:
            return await aw
        finally:
            if self.holding:
                gc.disable()

    def _collect(self) -> None:
        gc.collect(0)
        gc.freeze()
        self.collections += 1


class CollectionsSeen(Protocol):
    """What :func:`freeze_survivors` reads and resets: set when a collection ends (the loop's
    :class:`LoopTimes`, the decide bench's collector clock)."""

    freeze_due: bool


def freeze_survivors(times: CollectionsSeen, tuned: bool) -> None:
    """After a collection, freeze what survived it (:func:`gc.freeze`, a splice of the collector's
    lists): the older generations stay empty, so no collection walks more than the young objects
    since the last one. Called by the loop between batches (not from the collector's callback),
    only where the daemon tunes the collector.

    Measured at 10,000 nodes (one process, a generated fleet folded and decided every second): the
    young collections found 0 unreachable objects, and so did the middle and full ones: the
    daemon's state holds no cycles and the collector only ever walks it. A young collection
    (100,000 allocations) took up to 74 ms of CPU; the first middle one, over ten young ones'
    survivors, 195 ms of CPU (1.25 s of wall time at load 16); a full one over a restored
    10,000-node shard 683 ms of wall time. Frozen objects are still freed by reference counting
    when they die; a cycle among them that outlived the collection after its making would be kept."""
    if times.freeze_due:
        times.freeze_due = False
        if tuned:
            gc.freeze()


def tune_gc(gen0_threshold: int) -> None:
    """Collect young objects every ``gen0_threshold`` allocations instead of every 700, and move
    what exists at start-up (modules, compiled policies) out of the collector's sight for good.

    Reference counting frees almost everything the loop allocates (decoded records, snapshots); the
    cyclic collector only finds cycles, and with the default threshold it walked the young
    generation after every few dozen records. Process-wide, so the daemon's process sets it."""
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(gen0_threshold, gen1, gen2)
