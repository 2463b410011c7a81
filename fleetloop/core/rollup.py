"""Per-shard summaries and their fold into fleet figures. Pure: no I/O, no clock.

:func:`summarize` reads one shard's model at a tick boundary (the daemon calls it after deciding
the shard's ticks there). :class:`FleetRollup` folds the summaries of every shard of one consumer
group: the figure for boundary ``T`` adds up, per shard, its newest summary at or before ``T``, and
is *complete* once every live shard (one that reported within ``live_ms`` of event time before
``T``) has reported ``T`` or later. ``fleetloop rollup`` publishes complete figures at once and,
after a wall-clock hold, partial ones (a shard behind contributes its newest, older summary).

What adds up exactly across shards, and what does not:

- GPU cost (each node's telemetry is on exactly one partition) and its rate, pools, nodes,
  requests, retries and sheds in the window, and the retry budgets' allowances: exact sums.
- Tasks succeeded and failed: a task's last call (the one saying how it ended) is on one
  partition, so each finished task counts once; **tasks started** is not reported fleet-wide,
  because a workflow whose calls span pools on several partitions is started in each of them.
  Abandoned tasks (silent an hour) are counted failed by every shard that saw one of their calls.
- So cost per successful task = fleet GPU cost / tasks succeeded is exact, up to abandoned tasks.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from fleetloop.core.model.fleet import NANO, FleetModel
from fleetloop.schemas.decisions import FleetDecision
from fleetloop.schemas.summary import MAX_NUSD, ShardSummary

_P_REQ, _P_RETRY, _P_SHED = 0, 3, 4  # pool window columns (fleetloop.core.model.fleet)
HISTORY = 64  # summaries kept per shard: the fold aligns shards up to this many boundaries apart


def summarize(
    model: FleetModel,
    *,
    group: str,
    partition: int,
    ts_ms: int,
    tick_id: int,
    window_ms: int,
    retries_allowed: Mapping[str, int],
) -> ShardSummary:
    """Shard ``partition``'s figures at boundary ``ts_ms``. ``retries_allowed``: pool -> the
    pool-wide retry budget's ``retries_allowed_now`` of its newest decision."""
    requests = retries = shed = 0.0
    for pool in model.pools.values():
        w = pool.win.total(ts_ms, window_ms)
        requests += w[_P_REQ]
        retries += w[_P_RETRY]
        shed += w[_P_SHED]
    nodes = 0
    rate = 0.0
    for node_id in sorted(model.nodes):  # a fixed order: the float sum is the same every time
        t = model.nodes[node_id].telemetry
        if 0 <= ts_ms - t.ts_ms < window_ms:
            nodes += 1
            rate += t.cost_rate_usd_per_h
    ledger = model.ledger
    return ShardSummary(
        ts_ms=ts_ms,
        tick_id=tick_id,
        group=group,
        partition=partition,
        window_ms=window_ms,
        pools=len(model.pools),
        nodes=nodes,
        cost_rate_usd_per_h=rate,
        requests_w=int(requests),
        retries_w=int(retries),
        shed_w=int(shed),
        retries_allowed=sum(retries_allowed.get(p, 0) for p in model.pools),
        tasks_started=ledger.tasks_started,
        tasks_succeeded=ledger.tasks_succeeded,
        tasks_failed=ledger.tasks_failed,
        tasks_handed_off=ledger.tasks_handed_off,
        fleet_cost_nusd=min(ledger.fleet_cost_nusd, MAX_NUSD),
        spend_on_failed_nusd=min(ledger.spend_on_failed_nusd, MAX_NUSD),
    )


@dataclass(frozen=True, slots=True)
class Figures:
    """One fleet figure: the body to publish, the boundary, and the summaries it was made of."""

    ts_ms: int
    tick_id: int
    body: FleetDecision
    parts: tuple[ShardSummary, ...]


@dataclass(slots=True)
class FleetRollup:
    """Newest summaries per shard of ``group``; :meth:`complete` / :meth:`figures` per boundary."""

    group: str
    live_ms: int = 30_000
    shards: dict[int, deque[ShardSummary]] = field(default_factory=dict)
    published_ms: int = -1
    ignored: int = 0  # summaries of other groups, or older than the shard's newest

    def add(self, summary: ShardSummary) -> bool:
        """Take a summary in (any order across shards; a shard's own are in order); False: ignored."""
        if summary.group != self.group:
            self.ignored += 1
            return False
        history = self.shards.setdefault(summary.partition, deque(maxlen=HISTORY))
        if history and summary.ts_ms < history[-1].ts_ms:
            self.ignored += 1
            return False
        if history and summary.ts_ms == history[-1].ts_ms:
            history.pop()  # the same boundary again (a restart re-decided it): the newer wins
        history.append(summary)
        return True

    def newest_ms(self) -> int:
        return max((h[-1].ts_ms for h in self.shards.values() if h), default=-1)

    def live(self, ts_ms: int) -> list[int]:
        """Shards that reported within ``live_ms`` before ``ts_ms``."""
        return sorted(p for p, h in self.shards.items() if h and h[-1].ts_ms >= ts_ms - self.live_ms)

    def complete(self) -> list[int]:
        """Boundaries not yet published that every live shard has reached, oldest first."""
        newest = self.newest_ms()
        if newest <= self.published_ms:
            return []
        live = self.live(newest)
        reached = min(self.shards[p][-1].ts_ms for p in live)
        return sorted(
            {s.ts_ms for p in live for s in self.shards[p] if self.published_ms < s.ts_ms <= reached}
        )

    def pending(self) -> list[int]:
        """Boundaries seen but not yet published (complete or not), oldest first."""
        return sorted({s.ts_ms for h in self.shards.values() for s in h if s.ts_ms > self.published_ms})

    def figures(self, ts_ms: int) -> Figures:
        """The fleet figure at boundary ``ts_ms``; marks it (and every older one) published."""
        parts: list[ShardSummary] = []
        behind = 0
        for p in self.live(ts_ms):
            history = self.shards[p]
            behind += history[-1].ts_ms < ts_ms  # has not reported this boundary yet
            at = [s for s in history if s.ts_ms <= ts_ms]
            if at:
                parts.append(at[-1])  # its figures at the boundary (or its newest before it)
        self.published_ms = max(self.published_ms, ts_ms)
        return Figures(
            ts_ms, max((s.tick_id for s in parts), default=0), fleet_body(parts, behind), tuple(parts)
        )


def fleet_body(parts: Iterable[ShardSummary], behind: int = 0) -> FleetDecision:
    parts = list(parts)
    cost_nusd = sum(s.fleet_cost_nusd for s in parts)
    succeeded = sum(s.tasks_succeeded for s in parts)
    retries = sum(s.retries_w for s in parts)
    allowed = sum(s.retries_allowed for s in parts)
    return FleetDecision(
        entity="fleet",
        reason="complete" if behind == 0 else "partial",
        inputs={"shards_behind": float(behind)},
        shards=len(parts),
        shards_behind=behind,
        pools=sum(s.pools for s in parts),
        nodes=sum(s.nodes for s in parts),
        cost_rate_usd_per_h=sum(s.cost_rate_usd_per_h for s in sorted(parts, key=lambda s: s.partition)),
        requests_w=sum(s.requests_w for s in parts),
        retries_w=retries,
        retries_allowed=allowed,
        retry_budget_used_frac=(retries / allowed) if allowed else None,
        tasks_succeeded=succeeded,
        tasks_failed=sum(s.tasks_failed for s in parts),
        tasks_handed_off=sum(s.tasks_handed_off for s in parts),
        fleet_cost_usd=cost_nusd / NANO,
        spend_on_failed_usd=sum(s.spend_on_failed_nusd for s in parts) / NANO,
        cost_per_successful_task_usd=(cost_nusd / NANO / succeeded) if succeeded else None,
    )
