"""The workflow ledger over time: its clock, the tasks it lets go, the finished tasks it forgets.

The outcome fold (:mod:`fleetloop.core.model.fold`) opens, continues and ends a task one call at
a time; what happens between calls is here.

Tasks spanning partitions. A task calls several pools, and pools live on different partitions, so
one task's calls reach several shards while its last call (the one carrying ``task_outcome``)
reaches exactly one. That shard counts the outcome, once fleet-wide, and takes the whole task's
spend from the call itself (``workflow_spend_usd`` is the router's running total), so a failed
task's spend is exact without the other shards. Every other shard holds the task open only as long
as it keeps calling there: quiet for the handoff horizon (:func:`handoff_horizon_ms`, at most
``abandon_workflow_after_ms``) on the ledger's clock, it is let go as *handed off*
(``tasks_handed_off``): its outcome is another shard's to count, never a failure here. A later call
of it opens it again. The price of that rule: a task no shard ever sees end (its router died
mid-task) is counted by no shard, rather than as a failure by each shard it touched.

The ledger's clock is the upper median of the pools' newest outcome times: telemetry read ahead of
a backlog of outcomes does not make that backlog's tasks look quiet, and with three pools or more
one far-ahead record does not either. Event times are not monotonic (the door allows 30 s of
skew), so a task can leave up to that much late; never early.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import OrderedDict

from fleetloop.core.model.state import (
    _MAX_NUSD,
    _MAX_USD,
    GAP_EDGES_MS,
    NANO,
    ModelConfig,
    ModelState,
    _Workflow,
    nano_usd,
)
from fleetloop.schemas.fast import Outcome

_EDGE0 = GAP_EDGES_MS[0]
GAP_QUANTILE = 0.999
GAP_MIN_SAMPLES = 1_000


def handoff_horizon_ms(gaps: list[int], config: ModelConfig) -> int:
    """How long a task may go without a call in a shard before it is let go as handed off: twice
    the gap between one task's consecutive calls here that 99.9% of gaps stay within (the upper
    edge of its bucket), at least ``min_handoff_ms``, at most ``abandon_workflow_after_ms``, and
    that ceiling until ``GAP_MIN_SAMPLES`` gaps were seen. Learned like a retransmission timeout
    from round trips: a shard whose tasks call again within a second (their other calls went to
    other partitions) lets them go after seconds, one whose tasks wait on long calls or tools keeps
    them for minutes. A few long gaps (a hostile task) cannot move the quantile; many can raise it
    to the ceiling at most."""
    total = sum(gaps)
    ceiling = config.abandon_workflow_after_ms
    if total < GAP_MIN_SAMPLES:
        return ceiling
    need = GAP_QUANTILE * total
    seen = 0
    for i, n in enumerate(gaps):
        seen += n
        if seen >= need:
            if i == len(GAP_EDGES_MS):
                return ceiling
            return min(ceiling, max(config.min_handoff_ms, 2 * GAP_EDGES_MS[i]))
    return ceiling


class LedgerBook(ModelState):
    """The ledger's bookkeeping on the model (a part of :class:`fleetloop.core.model.fleet.FleetModel`)."""

    __slots__ = ()

    def _ledger_fifo(self) -> None:
        """Hold a ledger dict that has filled to half its cap as an ``OrderedDict``: same entries,
        same order, same checkpoint bytes (a mapping is written as its keys and values in order),
        and the cap's "let go of the earliest" reads its front in O(1).

        A plain dict does not close the holes deletions leave until it is resized, so
        ``next(iter(d))`` steps over every entry deleted from the front since: at the cap every new
        task deletes one, and a flood of new workflow ids (which the schema accepts) would make
        each new task's fold cost O(open tasks). An ``OrderedDict`` keeps its order in a linked
        list, so its front is one step away; it costs a little more per lookup and per entry, which
        is why a ledger below half its cap stays a plain dict. Called before a fold takes its local
        names for the dicts (a dict replaced mid-batch would leave them on the old one); a
        checkpoint restores plain dicts, and the first fold after it converts them again."""
        ledger, cfg = self.ledger, self.config
        if type(ledger.active) is dict and 2 * len(ledger.active) >= cfg.max_open_workflows:
            ledger.active = OrderedDict(ledger.active)
        if type(ledger.finished) is dict and 2 * len(ledger.finished) >= cfg.max_finished_workflows:
            ledger.finished = OrderedDict(ledger.finished)

    def _fold_task(self, o: Outcome, pool_id: str, ts: int) -> None:
        """The ledger's part of one outcome: its task opened (unless it finished already: a late or
        duplicate record), continued or ended, with its spend."""
        ledger = self.ledger
        active = ledger.active
        cost = o.cost_usd
        wf_id = o.workflow_id
        wf = active.get(wf_id)
        if wf is None:
            if wf_id in ledger.finished:
                return
            if len(active) >= self.config.max_open_workflows:
                # Full: the earliest opened is let go as handed off (by count, as by age), so a new
                # task, and the outcome of one that ends on its first call here, is never refused.
                self._close_workflow(active.pop(next(iter(active))))
                ledger.tasks_handed_off += 1
                self.evicted["workflows"] += 1
            wf = active[wf_id] = _Workflow(o.tenant_id, o.priority, ts, ts)
            ledger.tasks_started += 1
        else:
            gap = ts - wf.last_ms
            gaps = ledger.gaps
            if gap <= _EDGE0:
                gaps[0] += 1
            else:
                gaps[bisect_left(GAP_EDGES_MS, gap)] += 1
            if gap > 0:
                wf.last_ms = ts
        if pool_id not in wf.pools:
            wf.pools = (*wf.pools, pool_id)
            held = self.pools.get(pool_id)
            if held is not None:
                held.wf_open += 1
                held.wf_started += 1
        wf.attempts += 1
        if o.attempt == 0:
            wf.calls += 1
        spent = (round(cost * NANO) if cost < _MAX_USD else _MAX_NUSD) if cost > 0.0 else 0
        if spent:
            wf.spend_nusd += spent
        task_outcome = o.task_outcome
        if task_outcome is not None:
            del active[wf_id]
            self._close_workflow(wf)
            self._finish(wf_id, ts)
            if task_outcome == "succeeded":
                ledger.tasks_succeeded += 1
            else:
                ledger.tasks_failed += 1
                held = self.pools.get(pool_id)
                if held is not None:
                    held.wf_failed += 1
                # The router's running total covers the calls other shards saw; this shard's own sum
                # covers attempts a router reported without it. The task spent at least both.
                carried = nano_usd(o.workflow_spend_usd) + spent
                ledger.spend_on_failed_nusd += max(wf.spend_nusd, min(carried, _MAX_NUSD))

    def _close_workflow(self, wf: _Workflow) -> None:
        """An open task left the ledger (ended, or let go): it is no longer open on its pools."""
        for pool_id in wf.pools:
            pool = self.pools.get(pool_id)
            if pool is not None:
                pool.wf_open = max(0, pool.wf_open - 1)  # a pool dropped and re-made starts at 0
                pool.wf_ended += 1

    def _finish(self, wf_id: str, ts_ms: int) -> None:
        finished = self.ledger.finished
        finished[wf_id] = ts_ms
        if len(finished) > self.config.max_finished_workflows:
            del finished[next(iter(finished))]  # the longest-remembered one
            self.evicted["finished_workflows"] += 1

    def _advance_ledger_clock(self) -> None:
        """Move the ledger's clock to the upper median of the pools' outcome clocks and let go of
        what went quiet behind it. Outcomes alone: telemetry read ahead of a backlog of outcomes
        must not make the tasks in that backlog look quiet."""
        calls = sorted(p.outcomes_ms for p in self.pools.values() if p.outcomes_ms >= 0)
        if calls and calls[len(calls) // 2] > self.ledger.clock_ms:
            self.ledger.clock_ms = calls[len(calls) // 2]
            self._let_go_workflows(self.ledger.clock_ms)

    def _let_go_workflows(self, now: int) -> None:
        """Forget finished tasks past their ttl and let go of open ones quiet past the handoff
        horizon (handed off), both from the front of their insertion-ordered dicts: the work is what
        leaves, not what stays, so it runs at every move of the ledger's clock.

        The rule, entry by entry from the front: a finished task older than the ttl is forgotten,
        until one is not. An open task quiet past the horizon is let go; one opened before the
        horizon but still calling here is moved to the back (each entry at most once per pass);
        the first opened within the horizon stops the pass (:meth:`_let_go_active` states it).

        Here in one pass over each dict: reading the front with ``next(iter(d))`` once per entry
        that leaves would step again over every hole the deletions before it left (a dict closes
        them only when resized), so a pass letting ``k`` tasks go would cost ``k`` times the holes.
        One iterator per dict finds how far the front goes (each entry and hole read once), and
        then what leaves is deleted and what moves is moved in the rule's order, so the dicts hold
        the same entries in the same order and every counter gets the same additions. Only when
        every open task is older than the horizon (the whole dict was read without a stop) does
        the entry-by-entry loop go on from that state, with the moves it has left."""
        cfg = self.config
        ledger = self.ledger
        finished = ledger.finished
        ttl = cfg.finished_workflow_ttl_ms
        expired: list[str] = []
        for wf_id, finished_ms in finished.items():
            if now - finished_ms <= ttl:
                break
            expired.append(wf_id)
        if expired:
            for wf_id in expired:
                del finished[wf_id]
            self.evicted["finished_workflows"] += len(expired)
        active = ledger.active
        quiet = handoff_horizon_ms(ledger.gaps, cfg)
        gone: list[tuple[str, _Workflow]] = []
        moved: list[tuple[str, _Workflow]] = []
        stopped = False
        # In the rule's first pass over the entries there at its start, ``moves > 0`` always holds
        # (it starts at their count and drops by one per entry moved), so it is not read here.
        for wf_id, wf in active.items():
            if now - wf.last_ms > quiet:
                gone.append((wf_id, wf))
            elif now - wf.first_ms > quiet:
                moved.append((wf_id, wf))
            else:
                stopped = True
                break
        if not gone and not moved:
            return
        moves = len(active) - len(moved)
        close = self._close_workflow
        for wf_id, wf in gone:
            del active[wf_id]
            close(wf)
        if gone:
            ledger.tasks_handed_off += len(gone)
            self.evicted["workflows"] += len(gone)
        for wf_id, wf in moved:
            del active[wf_id]
            active[wf_id] = wf
        if not stopped:
            self._let_go_active(now, quiet, moves)

    def _let_go_active(self, now: int, quiet: int, moves: int) -> None:
        """The open tasks' rule, entry by entry from the front: let go of the quiet ones and move
        to the back those opened long ago but still calling here, each entry at most once per pass
        (``moves``), until one opened within the horizon is at the front."""
        ledger = self.ledger
        active = ledger.active
        while active:
            wf_id = next(iter(active))
            wf = active[wf_id]
            if now - wf.last_ms > quiet:
                del active[wf_id]
                self._close_workflow(wf)
                ledger.tasks_handed_off += 1
                self.evicted["workflows"] += 1
            elif now - wf.first_ms > quiet and moves > 0:
                moves -= 1
                del active[wf_id]  # opened long ago but still calling here: to the back
                active[wf_id] = wf
            else:
                break  # opened within the horizon, like (nearly) everything behind it
