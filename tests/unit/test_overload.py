"""Overload: a shard that decides more slowly than the boundaries come is held to at most
``overload_max_ticks`` boundaries waiting; the ticker holds the next ticks back and, once fewer wait,
publishes those it held back as one tick marked skipped ("overload: ...") and the newest boundary
(``fleetloop.daemon.runtime.ticker``, :func:`overload_step`). And the shard's bookkeeping of pools with
records pending costs what was folded, not the whole backlog (``Shard.pending_pools`` against its
statement ``tests.oracles.shard.pending_pools_plain``)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from fleetloop.bench.fleetgen import make_fleet, telemetry_at
from fleetloop.core.shard import INPUTS, Row, Shard
from fleetloop.daemon.runtime.config import SKIPPED_FROM_HEADER, SKIPPED_HEADER
from fleetloop.daemon.runtime.partition import HeldTick
from fleetloop.daemon.runtime.telemetry import DaemonStats
from fleetloop.daemon.runtime.ticker import Pace, Ticker, overload_step
from fleetloop.daemon.service.health import Health
from fleetloop.schemas import Tick
from fleetloop.schemas.topics import TELEMETRY, TICKS
from tests.oracles.shard import pending_pools_plain
from tests.support.runtime_harness import Rig, rig
from tests.support.virtual_time import FakeClock, run_virtual

TICK_MS = 1000
T0 = 1_800_000_000_000


def test_the_rule_holds_a_pools_ticks_back_once_limit_boundaries_wait() -> None:
    assert overload_step(0, 1, 5, False) == 1  # on time
    assert overload_step(0, 40, 5, True) == 40  # an outage, nothing waiting: caught up, all of it
    assert overload_step(0, 40, 5, False) == 1  # a ticker held up by a busy loop: the newest only
    assert overload_step(0, 5, 5, False) == 5
    assert overload_step(2, 1, 5, False) == 1
    assert overload_step(4, 1, 5, False) == 1  # 5 waiting after it: allowed
    assert overload_step(4, 2, 5, False) == 1  # the newest only
    assert overload_step(3, 9, 5, True) == 9  # an outage: caught up, then held back until decided
    assert overload_step(5, 1, 5, False) == 0  # 5 waiting: held back
    assert overload_step(5, 1, 5, True) == 0
    assert overload_step(10**12, 10**6, 5, False) == 0  # far behind
    assert overload_step(10**12, 7, 0, False) == 7  # 0: the rule is off
    assert overload_step(-3, 2, 5, False) == 2  # decided past what this instance published


class _Shard(Shard):
    def __init__(self, pools: list[str]) -> None:
        super().__init__(0)
        self._pools = pools

    def pools(self) -> list[str]:
        return list(self._pools)


Sent = list[tuple[str, Tick, dict[str, bytes]]]


def sent(r: Rig) -> Sent:
    """What the ticker published on control.ticks, in order: (key, tick, headers)."""
    return [
        ((x.key or b"").decode(), Tick.model_validate_json(x.value or b""), dict(x.headers))
        for x in r.broker.records(TICKS)
    ]


@contextlib.asynccontextmanager
async def _ticker(
    clock: FakeClock, limit: int, pools: list[str], **kw: Any
) -> AsyncIterator[tuple[Rig, Ticker, _Shard]]:
    async with rig(clock, overload_max_ticks=limit, **kw) as r:
        shard = _Shard(pools)
        r.own(0, shard)
        yield r, r.ticker(), shard


Then = Callable[[Rig, Ticker, _Shard], Awaitable[None]]


def _simulate(
    limit: int, seconds: int, decide_every_s: int, ticker_every_s: int = 1, then: Then | None = None
) -> tuple[list[int], DaemonStats, Health, Sent]:
    """``seconds`` boundaries; the ticker runs at every ``ticker_every_s``-th (held up by a busy
    loop in between) and the shard decides one tick record every ``decide_every_s`` boundaries (in
    the order published: a skipped record is passed as the daemon's loop passes it, at no cost).
    Returns, per boundary, how many boundaries the newest decided one is behind it; ``then``
    goes on with the same ticker afterwards."""

    async def run(clock: FakeClock) -> tuple[list[int], DaemonStats, Health, Sent]:
        pools = ["pool-a", "pool-b"]
        async with _ticker(clock, limit, pools) as (r, ticker, shard):
            queue: Sent = []
            behind: list[int] = []
            for s in range(seconds):
                now_b = T0 + s * TICK_MS
                start = len(sent(r))
                if s % ticker_every_s == 0:
                    held_up = ticker_every_s > 1  # it woke late: the loop held it up
                    await ticker.publish(now_b, TICK_MS, held_up=held_up)
                queue.extend(sent(r)[start:])
                budget = 1 if s % decide_every_s == 0 else 0
                while queue:
                    pool, tick, headers = queue[0]
                    if SKIPPED_HEADER in headers:
                        shard.skip(tick)
                    elif budget:
                        budget -= 1
                        shard.last_tick[pool] = (tick.tick_id, tick.ts_ms)
                    else:
                        break
                    queue.pop(0)
                newest = min(shard.last_tick.get(p, (0, T0 - TICK_MS))[1] for p in pools)
                behind.append((now_b - newest) // TICK_MS)
            if then is not None:
                await then(r, ticker, shard)
            return behind, r.stats, r.health, sent(r)

    return run_virtual(run, wall_ms=T0)


def test_a_shard_deciding_too_slowly_stays_a_bounded_number_of_boundaries_behind() -> None:
    """Two pools, one tick decided every 2 s (a quarter of what the ticks ask): with the rule the
    newest decided boundary stays within a few boundaries of now for 200 s; without it (0), it
    falls behind without bound, as the daemons did at 10,000 nodes."""
    limit = 3
    behind, stats, health, published = _simulate(limit, 200, 2)
    # Waiting: at most `limit` per pool, two pools, one decided every 2 s; plus the one in hand.
    assert max(behind[20:]) <= 2 * (2 * limit + 2), behind
    marks = [(t, h) for _, t, h in published if SKIPPED_HEADER in h]
    assert marks
    for tick, headers in marks:
        assert headers[SKIPPED_HEADER].startswith(b"overload: ")
        assert int(headers[SKIPPED_FROM_HEADER]) <= tick.tick_id
    # Every boundary of every pool is published exactly once: as a tick or inside a skipped range.
    for pool in ("pool-a", "pool-b"):
        covered: list[int] = []
        for key, tick, headers in published:
            if key != pool:
                continue
            if SKIPPED_HEADER in headers:
                covered.extend(range(int(headers[SKIPPED_FROM_HEADER]), tick.tick_id + 1))
            else:
                covered.append(tick.tick_id)
        assert covered == list(range(covered[0], covered[0] + len(covered))), pool
    assert stats.ticks_overload == sum(t.tick_id - int(h[SKIPPED_FROM_HEADER]) + 1 for t, h in marks)
    assert stats.overload_episodes == 1  # one episode, one log line: no flapping
    assert health.overloaded == [0]  # still in overload at the end: /healthz says so
    _, body = health.live()
    assert body["overload"] == {"partitions": [0], "ticks_skipped": stats.ticks_overload}

    unbounded, stats, _, published = _simulate(0, 200, 2)
    assert unbounded[-1] > 100, unbounded  # the rule off: every boundary decided, ever later
    assert not any(SKIPPED_HEADER in h for _, _, h in published)
    assert stats.ticks_overload == 0


@pytest.mark.parametrize("ticker_every_s", [2, 5])
def test_a_ticker_held_up_by_a_busy_loop_adds_no_backlog(ticker_every_s: int) -> None:
    """The ticker runs only every few boundaries (the loop held it up, deciding) and finds the
    shard has decided all it published: the boundaries it missed go out as skipped and the newest
    as a tick, not all of them as an outage's would (they would be the next backlog: how the
    10,000-node daemons fell further behind at every boundary)."""
    behind, stats, _, published = _simulate(3, 200, 2, ticker_every_s)
    assert max(behind[20:]) <= 2 * (2 * 3 + 2) + ticker_every_s, behind
    assert stats.ticks_overload > 0
    for _, _, headers in published:
        if SKIPPED_HEADER in headers:
            assert headers[SKIPPED_HEADER].startswith(b"overload: ")
    unbounded, _, _, _ = _simulate(0, 200, 2, ticker_every_s)
    assert unbounded[-1] > 100, unbounded


def test_an_episode_ends_once_the_shard_keeps_up_and_a_shard_on_time_never_skips() -> None:
    """Two ticks a boundary asked and one decided: overload. Then the shard decides every tick
    published at once: the episode ends (/healthz no longer reports the partition) and nothing more
    is skipped."""

    async def then(r: Rig, ticker: Ticker, shard: _Shard) -> None:
        assert r.stats.overload_episodes == 1
        assert r.health.overloaded == [0]

        async def keep_up(first_s: int, seconds: int) -> list[dict[str, bytes]]:
            start = len(sent(r))
            for s in range(first_s, first_s + seconds):
                at = len(sent(r))
                await ticker.publish(T0 + s * TICK_MS, TICK_MS)
                for pool, tick, headers in sent(r)[at:]:
                    if SKIPPED_HEADER in headers:
                        shard.skip(tick)
                    else:
                        shard.last_tick[pool] = (tick.tick_id, tick.ts_ms)
            return [h for _, _, h in sent(r)[start:]]

        # The held-back boundaries go out as skipped, then the boundaries on time: over after
        # overload_max_ticks (3) boundaries in a row with nothing held back or skipped.
        await keep_up(60, 5)
        assert r.health.overloaded == []
        assert not r.parts[0].withheld
        skipped = r.stats.ticks_overload
        later = await keep_up(65, 20)
        assert len(later) == 2 * 20
        assert not any(SKIPPED_HEADER in h for h in later)
        assert r.stats.ticks_overload == skipped
        assert r.stats.overload_episodes == 1

    _simulate(3, 60, 1, then=then)


# -- pending pools: the counts against the statement -----------------------------------------------


_TEMPLATE = next(iter(telemetry_at(make_fleet(16, seed=3), T0)))


def _rows(pools: list[str], start: int, n: int, rng: np.random.Generator) -> list[Row]:
    """``n`` telemetry rows from offset ``start``, of pools drawn from ``pools``; one in twenty
    without an item (the door refused it)."""
    out = []
    for k in range(n):
        pool = pools[int(rng.integers(len(pools)))]
        item = None
        if rng.random() >= 0.05:
            item = _TEMPLATE.model_copy(
                update={"pool_id": pool, "node_id": f"{pool}/n{int(rng.integers(4))}"}
            )
        out.append(Row(start + k, T0 + start + k, item))
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_pending_pools_after_a_fold_is_its_statement(seed: int) -> None:
    """Random reads (some re-fetched, some door-refused) and cuts; also 100,000 new pool ids in one
    read: after every fold ``pending_pools`` is the pools of the records still pending."""
    rng = np.random.default_rng(seed)
    shard = Shard(0)
    base = [f"pool-{i}" for i in range(12)]
    read = 0
    for step in range(40):
        pools = base if step != 20 else [f"new-{i}" for i in range(100_000)]
        n = int(rng.integers(1, 400)) if step != 20 else 100_000
        rows = _rows(pools, read, n, rng)
        if rng.random() < 0.2 and read:
            overlap = _rows(base, read - 3, 3, rng)  # a re-fetch of the last three, then new ones
            shard.add(TELEMETRY, overlap + rows)
        else:
            shard.add(TELEMETRY, rows)
        read += n
        cut = {
            TELEMETRY: int(rng.integers(shard.folded[TELEMETRY], read + 2)),
            **dict.fromkeys(INPUTS[1:], 0),
        }
        shard._fold_to(cut)
        assert shard.pending_pools == pending_pools_plain(shard), step
        assert set(shard._pending_n) == shard.pending_pools
        assert sum(shard._pending_n.values()) == sum(
            1 for r in shard.pending[TELEMETRY] if r.item is not None
        )
    shard.fold_read()
    assert shard.pending_pools == set() == pending_pools_plain(shard)


def test_the_benches_read_the_skipped_count_from_a_daemons_last_line(tmp_path: Any) -> None:
    from fleetloop.bench.loadgen import overload_args, overload_skipped

    console = tmp_path / "console.log"
    console.write_bytes(
        b"x [warning ] overload over: ... ticks_overload=7\n"
        b"y [info    ] daemon stopped  [fleetloop.daemon] commits=3 ticks_overload=42 ticks_skipped=1\n"
    )
    as_json = tmp_path / "json.log"
    as_json.write_bytes(b'{"event": "daemon stopped", "ticks_overload": 5, "commits": 1}\n')
    killed = tmp_path / "killed.log"
    killed.write_bytes(b"x [warning ] overload over: ... ticks_overload=7\n")
    assert overload_skipped(str(console)) == 42
    assert overload_skipped(str(as_json)) == 5
    assert overload_skipped(str(killed)) is None
    assert overload_skipped(str(tmp_path / "absent.log")) is None

    class Args:
        overload_max_ticks: int | None = None

    assert overload_args(Args()) == []
    Args.overload_max_ticks = 0
    assert overload_args(Args()) == ["--overload-max-ticks", "0"]


def test_a_shards_skipped_records_go_first_and_its_ticks_stay_together_by_boundary() -> None:
    """Every pool's skipped record before the shard's ticks, and the ticks boundary by boundary: the
    pools of one boundary stay consecutive on the partition, so the shard decides them in one batch
    (a skipped record between them split it into one decide per pool, when it was most behind)."""

    async def run(clock: FakeClock) -> Sent:
        pools = ["a", "b", "c"]
        async with _ticker(clock, 3, pools) as (r, ticker, shard):
            await ticker.publish(T0, TICK_MS)
            for pool in pools:
                shard.last_tick[pool] = (T0 // TICK_MS, T0)
            await ticker.publish(T0 + TICK_MS, TICK_MS)
            # One boundary waiting; the ticker, held up, comes back 4 boundaries later: newest only.
            start = len(sent(r))
            await ticker.publish(T0 + 5 * TICK_MS, TICK_MS, held_up=True)
            return sent(r)[start:]

    published = run_virtual(run, wall_ms=T0)
    kinds = ["skip" if SKIPPED_HEADER in h else "tick" for _, _, h in published]
    assert kinds == ["skip"] * 3 + ["tick"] * 3
    assert [k for k, _, _ in published] == ["a", "b", "c", "a", "b", "c"]
    assert {t.ts_ms for _, t, h in published if SKIPPED_HEADER not in h} == {T0 + 5 * TICK_MS}
    assert {int(h[SKIPPED_FROM_HEADER]) for _, _, h in published if SKIPPED_HEADER in h} == {
        T0 // TICK_MS + 2
    }


def test_an_outages_catch_up_goes_out_boundary_by_boundary() -> None:
    async def run(clock: FakeClock) -> Sent:
        async with _ticker(clock, 3, ["a", "b"]) as (r, ticker, shard):
            for pool in ("a", "b"):
                shard.last_tick[pool] = (T0 // TICK_MS, T0)  # decided before this instance (a restart)
            await ticker.publish(T0 + 3 * TICK_MS, TICK_MS)
            return sent(r)

    published = run_virtual(run, wall_ms=T0)
    assert [(k, t.ts_ms - T0) for k, t, _ in published] == [
        ("a", 1000),
        ("b", 1000),
        ("a", 2000),
        ("b", 2000),
        ("a", 3000),
        ("b", 3000),
    ]
    assert not any(SKIPPED_HEADER in h for _, _, h in published)


# -- a shard that decided what waited gets its held-back ticks at once -----------------------------


async def _held_back(r: Rig, ticker: Ticker, shard: _Shard, t0: int = T0) -> None:
    """Pools a, b, c ticked at boundaries ``t0`` .. ``t0`` + 3 s; a and b decided only ``t0``, so 2
    boundaries wait (the limit) and they are held back at the last one; c decided on time."""
    for s in range(4):
        await ticker.publish(t0 + s * TICK_MS, TICK_MS)
        shard.last_tick["c"] = ((t0 + s * TICK_MS) // TICK_MS, t0 + s * TICK_MS)
        if s == 0:
            for pool in ("a", "b"):
                shard.last_tick[pool] = (t0 // TICK_MS, t0)


def test_the_loop_wakes_the_ticker_once_a_held_back_shard_has_decided_what_waited() -> None:
    async def run(clock: FakeClock) -> None:
        async with _ticker(clock, 2, ["a", "b", "c"]) as (r, ticker, shard):
            await _held_back(r, ticker, shard)
            owned = r.parts[0]
            assert set(owned.withheld) == {"a", "b"}  # 2 waiting at boundary 3: held back
            owned.held = [HeldTick(99, None, T0, None, None, 0.0)]  # ticks still queued: not yet
            ticker.wake_held_back()
            assert not ticker.tick_now.is_set()
            owned.held = []
            ticker.wake_held_back()  # the queue is empty but a's and b's ticks are not decided yet
            assert not ticker.tick_now.is_set()
            shard.last_tick["a"] = ((T0 + TICK_MS) // TICK_MS, T0 + TICK_MS)  # a: 1 waiting, under the limit
            ticker.wake_held_back()
            assert ticker.tick_now.is_set()
            ticker.tick_now.clear()
            ticker.config = replace(ticker.config, overload_max_ticks=1)
            ticker.wake_held_back()  # a still has 1 waiting: not under a limit of 1
            assert not ticker.tick_now.is_set()

    run_virtual(run, wall_ms=T0)


def test_a_round_between_boundaries_publishes_only_the_held_back_pools() -> None:
    """Between boundaries 4 and 5, a and b decided what waited: each gets one skipped record (the
    boundaries held back but the newest) and a tick at boundary 4 (the newest passed); c, on time,
    gets nothing more; the episode goes on until boundaries are published whole."""

    async def run(clock: FakeClock) -> tuple[Sent, dict[str, tuple[int, int]], list[int]]:
        async with _ticker(clock, 2, ["a", "b", "c"]) as (r, ticker, shard):
            await _held_back(r, ticker, shard)
            await ticker.publish(T0 + 4 * TICK_MS, TICK_MS)
            shard.last_tick["c"] = ((T0 + 4 * TICK_MS) // TICK_MS, T0 + 4 * TICK_MS)
            for pool in ("a", "b"):
                shard.last_tick[pool] = ((T0 + 2 * TICK_MS) // TICK_MS, T0 + 2 * TICK_MS)
            start = len(sent(r))
            await ticker.publish(T0 + 4 * TICK_MS, TICK_MS, held_up=True, held_back_only=True)
            return sent(r)[start:], dict(r.parts[0].withheld), list(r.health.overloaded)

    published, withheld, overloaded = run_virtual(run, wall_ms=T0)
    assert [(k, "skip" if SKIPPED_HEADER in h else "tick", t.ts_ms - T0) for k, t, h in published] == [
        ("a", "skip", 3000),
        ("b", "skip", 3000),
        ("a", "tick", 4000),
        ("b", "tick", 4000),
    ]
    assert {int(h[SKIPPED_FROM_HEADER]) for _, _, h in published if SKIPPED_HEADER in h} == {
        T0 // TICK_MS + 3
    }
    assert withheld == {}
    assert overloaded == [0]


def test_the_ticker_publishes_held_back_ticks_when_woken_not_at_the_next_boundary() -> None:
    """The ticker task itself (virtual time, 1 s ticks): woken by the loop just after a boundary, it
    publishes the held-back pools' ticks at once; without the wake they would wait for the next
    boundary (the mutation: the wake not sent -> nothing within the tick period)."""

    async def run(clock: FakeClock, wake: bool) -> tuple[int, Sent, int]:
        async with _ticker(clock, 2, ["a", "b", "c"], tick_read_wait_s=0.0) as (r, ticker, shard):
            now = clock.wall_ms()
            await _held_back(r, ticker, shard, t0=now // TICK_MS * TICK_MS - 10 * TICK_MS)
            for pool in ("a", "b", "c"):  # everything published so far decided; a, b still held back
                published = r.parts[0].ticked[pool]
                shard.last_tick[pool] = (published // TICK_MS, published)
            now = clock.wall_ms()
            await asyncio.sleep((TICK_MS - now % TICK_MS) / 1000.0 + 0.05)  # just after a boundary
            stop = asyncio.Event()
            start = len(sent(r))
            task = asyncio.create_task(ticker.run(stop))
            await asyncio.sleep(0.05)
            woke_at = clock.wall_ms()
            if wake:
                ticker.wake_held_back()
                assert ticker.tick_now.is_set()
            while len(sent(r)) == start and clock.wall_ms() - woke_at < 2 * TICK_MS:
                await asyncio.sleep(0.005)
            took_ms = clock.wall_ms() - woke_at
            stop.set()
            await task
            return took_ms, sent(r)[start:], woke_at

    took_ms, published, woke_at = run_virtual(lambda clock: run(clock, True), wall_ms=T0)
    assert took_ms < 300, took_ms
    assert published
    assert {k for k, _, _ in published} <= {"a", "b"}  # only the held-back pools between boundaries
    newest = max(t.ts_ms for _, t, h in published if SKIPPED_HEADER not in h)
    assert newest == woke_at // TICK_MS * TICK_MS  # the newest boundary passed
    took_ms, _, _ = run_virtual(lambda clock: run(clock, False), wall_ms=T0)
    assert took_ms > 800, took_ms


# -- an outage's catch-up, capped when the shard is already slow -------------------------------------


def _outage(pace: dict[int, float], budget: float = 10.0) -> tuple[DaemonStats, Sent]:
    """A new owner of shard 0 (pools a and b last decided at T0 by the previous owner) publishes
    at T0 + 30 s: 30 boundaries missed, an outage's."""

    async def run(clock: FakeClock) -> tuple[DaemonStats, Sent]:
        async with _ticker(clock, 2, ["a", "b"], catchup_budget_s=budget) as (r, ticker, shard):
            r.pace.seconds.update(pace)
            for pool in ("a", "b"):
                shard.last_tick[pool] = (T0 // TICK_MS, T0)
            await ticker.publish(T0 + 30 * TICK_MS, TICK_MS)
            return r.stats, sent(r)

    return run_virtual(run, wall_ms=T0)


def test_a_slow_shards_outage_catch_up_is_capped_to_what_fits_the_budget() -> None:
    """2 s a boundary, a 10 s budget: the newest 5 boundaries are caught up, the 25 before them go
    out as one skipped record per pool (every boundary covered once); fast, or with the budget off,
    all 30 are caught up as before."""
    stats, published = _outage({0: 2.0})
    ticks = [(k, t.ts_ms - T0) for k, t, h in published if SKIPPED_HEADER not in h]
    marks = [(k, t, h) for k, t, h in published if SKIPPED_HEADER in h]
    assert ticks == [(pool, s * TICK_MS) for s in range(26, 31) for pool in ("a", "b")]
    assert [k for k, _, _ in marks] == ["a", "b"]
    for _, tick, headers in marks:
        assert int(headers[SKIPPED_FROM_HEADER]) == T0 // TICK_MS + 1
        assert tick.ts_ms == T0 + 25 * TICK_MS
        assert headers[SKIPPED_HEADER].startswith(b"outage: 25 ticks missed, beyond the catch-up of 5: ")
    assert stats.ticks_catchup_capped == 50
    assert stats.ticks_caught_up == 2 * 4
    # A shard this instance never decided takes the mean pace of those it did (the same machine).
    _, published = _outage({3: 1.0, 5: 3.0})
    assert sum(1 for _, _, h in published if SKIPPED_HEADER not in h) == 2 * 5
    # At least overload_max_ticks, whatever the pace.
    _, published = _outage({0: 60.0})
    assert sum(1 for _, _, h in published if SKIPPED_HEADER not in h) == 2 * 2
    for pace, budget in (({0: 0.2}, 10.0), ({0: 2.0}, 0.0), ({}, 10.0)):
        stats, published = _outage(pace, budget)
        assert not any(SKIPPED_HEADER in h for _, _, h in published), (pace, budget)
        assert len(published) == 2 * 30
        assert stats.ticks_catchup_capped == 0


def test_the_pace_is_each_boundarys_wall_time_each_weighing_half() -> None:
    pace = Pace()
    pace.note(0, 4.0)
    assert pace.of(0) == 4.0
    pace.note(0, 2.0)
    pace.note(0, 1.0)
    assert pace.of(0) == 2.0
    assert pace.of(7) == 2.0  # a shard not decided here yet: the others' mean, the same machine
    assert Pace().of(0) is None


def test_ticks_published_and_not_decided_are_in_flight() -> None:
    """The loop line's ``fetch_in_flight``: a tick this instance published that its shard has not
    decided (read back) yet; none once each pool's newest published boundary is decided, nor once
    the partition is forgotten (its record dropped)."""

    async def run(clock: FakeClock) -> None:
        async with _ticker(clock, 2, ["a", "b", "c"]) as (r, ticker, shard):
            await _held_back(r, ticker, shard)
            assert ticker.in_flight()  # a and b: 2 boundaries waiting
            assert ticker.holding_back()
            r.parts.forget(0)
            assert not ticker.in_flight()
            assert not ticker.holding_back()
            owned = r.own(0, shard)
            assert not ticker.in_flight()  # a new record: nothing published by this instance yet
            await ticker.publish(T0 + 4 * TICK_MS, TICK_MS)
            for pool in ("a", "b", "c"):
                published = owned.ticked[pool]
                shard.last_tick[pool] = (published // TICK_MS, published)
            assert not ticker.in_flight()

    run_virtual(run, wall_ms=T0)
