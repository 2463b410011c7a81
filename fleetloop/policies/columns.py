"""One snapshot's nodes as fleet-wide columns, pool by pool: what a policy reads instead of a Python
object per node when it judges every node of every pool each tick.

A whole-fleet tick at 10,000 nodes in ~240 pools of 16-64 nodes has ~3 us per decision for
everything. A numpy call costs 1-5 us whatever its length, so per-pool arrays spend most of their
time in call overhead; a figure computed for every node of the fleet at once (one array per field,
rows grouped by pool) pays that overhead once per tick. :func:`fleet_columns` builds the columns
once per snapshot (kept in ``snap.memo``, like the pools' node tuples) and hands them to every pool's
tick:

- ``nodes``: every pool's nodes, pool by pool in pool-id order, each pool's in node-id order
  (exactly ``snap.pool_nodes(pool)`` for each pool, concatenated), so row ``r`` is ``nodes[r]``;
- ``bounds[pool_id] = (start, end)``: the pool's rows; ``pool_of[r]``: the index of row ``r``'s pool
  in ``pool_ids``; ``starts``: each pool's first row (for ``np.ufunc.reduceat``);
- ``floats(field)`` / ``ints(field)``: one node field as an array (a missing figure is NaN),
  ``warm`` / ``stale`` / ``draining``: the flags, each built on first use and kept.

:func:`segment_medians` gives each pool's median of a column with the arithmetic of
:func:`fleetloop.policies.memory.median_sorted` (the middle value, or ``(a + b) / 2`` of the two
middle ones), so the same doubles as a sorted list per pool. The columns hold the views' own values
(``tests/unit/test_fast_columns.py`` checks them against the views on generated fleets with nodes
joining and leaving). Pure: no I/O, no clock.

Where the columns come from. The daemon's model hands the snapshot its nodes as a
:class:`NodeTable`: the rows in this same order, each node's newest telemetry record, its window
totals as one ``(rows, 8)`` array (summed for the whole fleet at once) and its run of failed calls.
``snap.nodes`` *is* that table (a read-only mapping of node id to :class:`NodeView`, in node-id
order, as before): a view is built only when a policy asks for that node, and kept. The columns
read the table directly, never a view per node: the first telemetry field asked for reads every
numeric telemetry field of every record in one pass into one ``(fields, rows)`` array
(:meth:`NodeTable.numbers`; the per-column reads ``floats_plain`` / ``ints_plain`` / ``flag_plain``
stay as the statement, ``tests/unit/test_column_read.py`` holds the two equal bit for bit on hostile
values), and a window figure is one array operation over the totals. A snapshot built any other
way (a plain dict of views, as tests and the simulator's helpers may build) gets its columns from
the views, as before.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from itertools import chain
from operator import attrgetter
from typing import Any, overload

import numpy as np
import numpy.typing as npt

from fleetloop.policies.base import FleetSnapshot, NodeView

Ints = npt.NDArray[np.int64]
Floats = npt.NDArray[np.float64]
Bools = npt.NDArray[np.bool_]

_KEY = ("fleet_columns",)


# A node's window columns in a NodeTable's totals (the model's node window layout).
W_REQ, W_OK, W_FAIL, W_TTFT_SUM, W_TTFT_N, W_ERR, W_TO, W_PRE = range(8)
_WINDOW_INTS = {
    "requests_w": W_REQ,
    "ok_w": W_OK,
    "failures_w": W_FAIL,
    "node_errors_w": W_ERR,
    "node_timeouts_w": W_TO,
    "preemptions_w": W_PRE,
}
_DERIVED = {"last_seen_ms", "age_ms", "consecutive_failures", "ttft_mean_ms_w", *_WINDOW_INTS}
_FLAGS = {"warm", "stale", "draining"}
_VIEW_FIELDS = tuple(f.name for f in fields(NodeView))
# Each slot's setter, in field order: a view is built by setting its slots on a bare instance, which
# is what the frozen dataclass's ``__init__`` does, without its per-field ``object.__setattr__`` call
# and keyword matching.
_VIEW_SETTERS = tuple(getattr(NodeView, name).__set__ for name in _VIEW_FIELDS)
_new = object.__new__
_INT64_LIMIT = 2.0**63
# The telemetry fields a view copies as numbers (``ts_ms`` aside: the table's ``ts``). The table
# reads them in one pass over the records (:meth:`NodeTable.numbers`) the first time a policy asks
# for any of them, instead of one pass per column.
_TEL_NUMBERS = (
    "gpu_count",
    "draining",
    "queue_depth",
    "running_requests",
    "queued_prompt_tokens",
    "kv_cache_used_frac",
    "hbm_free_gib",
    "gpu_util_frac",
    "prefix_cache_hit_frac",
    "ttft_p50_ms",
    "ttft_p99_ms",
    "tbt_p50_ms",
    "tbt_p99_ms",
    "max_batch_tokens",
    "cost_rate_usd_per_h",
)
_TEL_COLUMN = {name: j for j, name in enumerate(_TEL_NUMBERS)}
_TEL_ROW = attrgetter(*_TEL_NUMBERS)
_EXACT = 2.0**53  # every integer of smaller magnitude is a double exactly
N_TEL = len(_TEL_NUMBERS)


def tel_numbers(tels: Sequence[Any]) -> Floats:
    """Every field of ``_TEL_NUMBERS`` of each record as one row of doubles: a ``(len(tels), N_TEL)``
    array, read in one flat pass (``np.fromiter`` over the fields, record after record). Each element
    is numpy's conversion of that value to a double (``float(value)``; None is NaN), the one
    ``np.array`` of the nested rows makes, so row ``r`` column ``j`` is ``floats_plain`` of field
    ``j`` at record ``r``. Raises ``TypeError`` / ``ValueError`` / ``OverflowError`` when a value is
    not one number (a sequence among them too: where ``np.array`` of the rows would add a dimension,
    this refuses it); the caller then reads each column on its own (:meth:`NodeTable.numbers`).
    About a quarter cheaper than ``np.array`` of the rows, which first discovers the nesting."""
    n = len(tels)
    flat = np.fromiter(chain.from_iterable(map(_TEL_ROW, tels)), dtype=np.float64, count=n * N_TEL)
    return flat.reshape(n, N_TEL)


class NodeTable(Mapping[str, NodeView]):
    """A snapshot's nodes as rows: what the model freezes at a tick, read as columns by
    :func:`fleet_columns` and as :class:`NodeView` objects (built on first use, then kept) through
    the mapping interface (node id -> view, iterating in node-id order, like the dict it replaces).

    Rows are grouped by pool (pool-id order), each pool's in node-id order. Per row: ``ids`` (node
    id), ``tels`` (the node's newest telemetry record: anything with the telemetry fields a
    :class:`NodeView` copies), ``consecutive`` (its run of failed calls), ``totals[row]`` (its
    window columns ``W_*`` summed over the snapshot's window), ``ts`` (the record's ``ts_ms``).
    Everything is captured when the snapshot is taken: the model may fold on while policies read.
    """

    __slots__ = (
        "_index",
        "_memo",
        "_numbers",
        "_sorted",
        "_views",
        "bounds",
        "consecutive",
        "ids",
        "now_ms",
        "pool_ids",
        "stale_after_ms",
        "tels",
        "totals",
        "ts",
    )

    def __init__(
        self,
        *,
        now_ms: int,
        stale_after_ms: int,
        ids: Sequence[str],
        tels: Sequence[Any],
        consecutive: Sequence[int],
        totals: Floats,
        ts: Ints,
        pool_ids: tuple[str, ...],
        bounds: Mapping[str, tuple[int, int]],
        index: Mapping[str, int] | None = None,
        sorted_ids: Sequence[str] | None = None,
        numbers: Floats | None = None,
    ) -> None:
        self.now_ms = now_ms
        self.stale_after_ms = stale_after_ms
        self.ids = ids
        self.tels = tels
        self.consecutive = consecutive
        self.totals = totals
        self.ts = ts
        self.pool_ids = pool_ids  # pools with at least one row, in row order (sorted)
        self.bounds = bounds  # pool id -> (first row, end row)
        self._index = index if index is not None else {n: i for i, n in enumerate(ids)}
        self._sorted = sorted_ids if sorted_ids is not None else sorted(ids)
        self._views: list[NodeView | None] = [None] * len(ids)
        self._memo: dict[str, npt.NDArray[np.generic]] = {}
        # ``numbers``: the ``(fields, rows)`` block :meth:`numbers` would read from these records,
        # already read (the model keeps it up to date as it folds); None: read on first use.
        # False: the one pass could not read them.
        self._numbers: Floats | bool | None = numbers

    # -- the mapping: node id -> NodeView -------------------------------------------------------

    def __getitem__(self, node_id: str) -> NodeView:
        return self.view(self._index[node_id])

    def __contains__(self, node_id: object) -> bool:
        return node_id in self._index

    def __iter__(self) -> Iterator[str]:
        return iter(self._sorted)

    def __len__(self) -> int:
        return len(self.ids)

    def __repr__(self) -> str:
        return f"NodeTable({len(self.ids)} nodes)"

    def view(self, row: int) -> NodeView:
        """Row ``row`` as a :class:`NodeView` (built once): the values a snapshot of views held."""
        found = self._views[row]
        if found is None:
            found = self._views[row] = self._build(row, self.totals[row].tolist())
        return found

    def _build(self, row: int, w: list[float]) -> NodeView:
        t = self.tels[row]
        age = max(0, self.now_ms - t.ts_ms)
        values = (
            t.node_id,
            t.pool_id,
            t.model,
            t.gpu_type,
            t.gpu_count,
            t.weights_state,
            t.draining,
            t.ts_ms,
            age,
            age > self.stale_after_ms,
            t.queue_depth,
            t.running_requests,
            t.queued_prompt_tokens,
            t.kv_cache_used_frac,
            t.hbm_free_gib,
            t.gpu_util_frac,
            t.prefix_cache_hit_frac,
            t.hot_prefixes,
            t.ttft_p50_ms,
            t.ttft_p99_ms,
            t.tbt_p50_ms,
            t.tbt_p99_ms,
            t.max_batch_tokens,
            t.cost_rate_usd_per_h,
            int(w[W_REQ]),
            int(w[W_OK]),
            int(w[W_FAIL]),
            self.consecutive[row],
            (w[W_TTFT_SUM] / w[W_TTFT_N]) if w[W_TTFT_N] else None,
            int(w[W_ERR]),
            int(w[W_TO]),
            int(w[W_PRE]),
            t.engine,
        )
        view = _new(NodeView)
        for setter, value in zip(_VIEW_SETTERS, values, strict=True):
            setter(view, value)
        return view

    def pool_views(self, pool_id: str) -> tuple[NodeView, ...]:
        """The pool's rows as views (node-id order): ``snap.pool_nodes`` for a table snapshot."""
        a, b = self.bounds.get(pool_id, (0, 0))
        views = self._views
        if None in views[a:b]:
            build = self._build
            for r, w in zip(range(a, b), self.totals[a:b].tolist(), strict=True):
                if views[r] is None:
                    views[r] = build(r, w)
        return tuple(views[a:b])  # type: ignore[arg-type]

    # -- the columns ----------------------------------------------------------------------------

    def _window_int(self, name: str) -> Floats:
        """``int(total)`` of a window column, as doubles (the view's value; never -0.0)."""
        return np.trunc(self.totals[:, _WINDOW_INTS[name]]) + 0.0

    def floats(self, name: str) -> Floats:
        """The views' field ``name`` for every row as doubles (None is NaN), without the views."""
        found = self._memo.get(name)
        if found is None:
            if name in _FLAGS:
                found = self.flag(name).astype(np.float64)
            elif name in _DERIVED:
                if name in _WINDOW_INTS:
                    found = self._window_int(name)
                elif name == "ttft_mean_ms_w":
                    n = self.totals[:, W_TTFT_N]
                    found = np.full(len(self.ids), np.nan)
                    np.divide(self.totals[:, W_TTFT_SUM], n, out=found, where=n != 0)
                else:
                    found = self.ints(name).astype(np.float64)
            elif (j := _TEL_COLUMN.get(name)) is not None and (block := self.numbers()) is not None:
                found = block[j]
            else:
                found = self.floats_plain(name)
            self._memo[name] = found
        return found  # type: ignore[return-value]

    def ints(self, name: str) -> Ints:
        key = f"int:{name}"
        found = self._memo.get(key)
        if found is None:
            if name in _FLAGS:
                found = self.flag(name).astype(np.int64)
            elif name in _WINDOW_INTS:
                col = self._window_int(name)
                if len(col) and not np.abs(col).max() < _INT64_LIMIT:
                    raise OverflowError(f"{name} beyond int64")  # as np.array(ints, int64) would
                found = col.astype(np.int64)
            elif name == "last_seen_ms":
                found = self.ts.copy()
            elif name == "age_ms":
                found = np.maximum(self.now_ms - self.ts, 0)
            elif name == "consecutive_failures":
                found = np.array(self.consecutive, dtype=np.int64)
            else:
                found = self._ints_read(name)
            self._memo[key] = found
        return found  # type: ignore[return-value]

    def flag(self, name: str) -> Bools:
        """``warm`` / ``stale`` / ``draining`` of every row."""
        key = f"flag:{name}"
        found = self._memo.get(key)
        if found is None:
            if name == "stale":
                found = self.ints("age_ms") > self.stale_after_ms
            elif name == "warm":
                states = map(attrgetter("weights_state"), self.tels)
                found = np.array([s == "warm" for s in states], dtype=np.bool_) & ~self.flag("draining")
            else:
                found = self._flag_read(name)
            self._memo[key] = found
        return found  # type: ignore[return-value]

    # -- reading the telemetry records: the plain forms (one pass per column, the statement) and
    # -- the one pass over every numeric field that stands in for them, value for value.

    def floats_plain(self, name: str) -> Floats:
        """A telemetry field of every row as doubles: ``float(value)``, None is NaN (numpy's reading
        of a list, given the dtype). What :meth:`floats` returns for a telemetry field."""
        return np.array(list(map(attrgetter(name), self.tels)), dtype=np.float64)

    def ints_plain(self, name: str) -> Ints:
        """A telemetry field of every row as int64 (numpy's reading of a list, given the dtype)."""
        return np.array(list(map(attrgetter(name), self.tels)), dtype=np.int64)

    def flag_plain(self, name: str) -> Bools:
        """A telemetry field of every row as booleans (numpy's reading of a list, given the dtype)."""
        return np.array(list(map(attrgetter(name), self.tels)), dtype=np.bool_)

    def numbers(self) -> Floats | None:
        """Every field of ``_TEL_NUMBERS`` for every row as one ``(fields, rows)`` array of doubles,
        read in one pass over the records (:func:`tel_numbers`, built once, or handed over already
        read by the model): row ``j`` is ``floats_plain`` of field ``j``, value for value, because
        numpy converts each element the way it converts each element of a flat list
        (``float(value)``; None is NaN). None when a record holds something that is not one number
        in one of those fields: then each column is read on its own, as before, and only a column
        that holds it fails, as it always did."""
        block = self._numbers
        if block is None:
            try:
                block = np.ascontiguousarray(tel_numbers(self.tels).T)
            except (TypeError, ValueError, OverflowError):
                block = False
            self._numbers = block
        return None if block is False else block  # type: ignore[return-value]

    def _ints_read(self, name: str) -> Ints:
        """``ints_plain(name)``, from the one pass when every value there is below 2**53 in
        magnitude. Then each double is the value itself (an int or a bool of that size is a double
        exactly, a float is one), and numpy's int64 reading of the value (``int(value)``: an
        integer as it is, a fraction truncated toward zero) is the cast of the double, which
        truncates toward zero too. Anything else (None, NaN, inf, a larger magnitude) is read again
        on its own, as the plain form reads it, raising where it raises."""
        j = _TEL_COLUMN.get(name)
        block = self.numbers() if j is not None else None
        if block is not None:
            col = block[j]
            if bool((np.abs(col) < _EXACT).all()):
                return col.astype(np.int64)
        return self.ints_plain(name)

    def _flag_read(self, name: str) -> Bools:
        """``flag_plain(name)``, from the one pass when every value there is 0 or 1 (False, True,
        0, 1, 0.0, -0.0, 1.0: numpy's boolean of each is ``value == 1``); else read on its own."""
        j = _TEL_COLUMN.get(name)
        block = self.numbers() if j is not None else None
        if block is not None:
            col = block[j]
            one: Bools = col == 1.0
            if bool((one | (col == 0.0)).all()):
                return one
        return self.flag_plain(name)

    @property
    def stale(self) -> Bools:
        return self.flag("stale")


class RowViews(Sequence[NodeView]):
    """A table's rows as a sequence of views, each built when asked for (and kept by the table).
    Equal to any sequence of the same views (``cols.nodes == tuple(views)``); a slice is a tuple."""

    __slots__ = ("_table",)

    def __init__(self, table: NodeTable) -> None:
        self._table = table

    def __len__(self) -> int:
        return len(self._table.ids)

    @overload
    def __getitem__(self, i: int) -> NodeView: ...
    @overload
    def __getitem__(self, i: slice) -> tuple[NodeView, ...]: ...
    def __getitem__(self, i: int | slice) -> NodeView | tuple[NodeView, ...]:
        if isinstance(i, slice):
            view = self._table.view
            return tuple([view(r) for r in range(*i.indices(len(self)))])
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        return self._table.view(i)

    def __iter__(self) -> Iterator[NodeView]:
        view = self._table.view
        return (view(r) for r in range(len(self)))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence) and not isinstance(other, str):
            return len(other) == len(self) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]


@dataclass(frozen=True, slots=True, eq=False)
class FleetColumns:
    pool_ids: tuple[str, ...]  # pools with at least one node, sorted
    nodes: Sequence[NodeView]  # row r's view (built on first use when the snapshot is a NodeTable)
    bounds: Mapping[str, tuple[int, int]]
    pool_of: Ints
    starts: Ints
    _memo: dict[str, npt.NDArray[np.generic]] = field(default_factory=dict)
    table: NodeTable | None = None  # the rows' source, when the snapshot's nodes are a NodeTable

    def __len__(self) -> int:
        return len(self.nodes)

    def floats(self, name: str) -> Floats:
        """The field ``name`` of every row as doubles; a missing figure (None) is NaN."""
        if self.table is not None:
            return self.table.floats(name)
        found = self._memo.get(name)
        if found is None:
            nan = np.nan
            found = self._memo[name] = np.array(
                [nan if (v := getattr(n, name)) is None else v for n in self.nodes], dtype=np.float64
            )
        return found  # type: ignore[return-value]

    def ints(self, name: str) -> Ints:
        if self.table is not None:
            return self.table.ints(name)
        key = f"int:{name}"
        found = self._memo.get(key)
        if found is None:
            found = self._memo[key] = np.array([getattr(n, name) for n in self.nodes], dtype=np.int64)
        return found  # type: ignore[return-value]

    def _flag(self, name: str) -> Bools:
        if self.table is not None:
            return self.table.flag(name)
        found = self._memo.get(name)
        if found is None:
            nodes = self.nodes
            if name == "warm":
                values = [n.weights_state == "warm" and not n.draining for n in nodes]
            else:
                values = [bool(getattr(n, name)) for n in nodes]
            found = self._memo[name] = np.array(values, dtype=np.bool_)
        return found  # type: ignore[return-value]

    @property
    def warm(self) -> Bools:
        """``NodeView.warm``: weights loaded and not draining."""
        return self._flag("warm")

    @property
    def stale(self) -> Bools:
        return self._flag("stale")

    @property
    def draining(self) -> Bools:
        return self._flag("draining")


def _layout(pool_ids: list[str], sizes: list[int]) -> tuple[Ints, Ints]:
    counts = np.array(sizes, dtype=np.int64)
    pool_of = np.repeat(np.arange(len(pool_ids), dtype=np.int64), counts)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64) if sizes else counts
    return pool_of, starts


def fleet_columns(snap: FleetSnapshot) -> FleetColumns:
    """The snapshot's nodes as columns, pool by pool (built once per snapshot)."""
    found: FleetColumns | None = snap.memo.get(_KEY)
    if found is None:
        table = snap.nodes
        if isinstance(table, NodeTable):
            pool_of, starts = _layout(
                list(table.pool_ids), [table.bounds[p][1] - table.bounds[p][0] for p in table.pool_ids]
            )
            found = snap.memo[_KEY] = FleetColumns(
                table.pool_ids, RowViews(table), table.bounds, pool_of, starts, table=table
            )
            return found
        nodes: list[NodeView] = []
        pool_ids: list[str] = []
        bounds: dict[str, tuple[int, int]] = {}
        sizes: list[int] = []
        for pool_id in sorted(snap.pools):
            pool = snap.pool_nodes(pool_id)
            if pool:
                bounds[pool_id] = (len(nodes), len(nodes) + len(pool))
                pool_ids.append(pool_id)
                sizes.append(len(pool))
                nodes.extend(pool)
        pool_of, starts = _layout(pool_ids, sizes)
        found = snap.memo[_KEY] = FleetColumns(tuple(pool_ids), tuple(nodes), bounds, pool_of, starts)
    return found


def segment_medians(values: Floats, pool_of: Ints, n_pools: int) -> tuple[Floats, Ints]:
    """Per pool: the median of its rows' values that are not NaN (NaN where it has none), and how
    many there are. The same doubles as ``median_sorted(sorted(xs))`` over each pool's values."""
    present = ~np.isnan(values)
    count = np.bincount(pool_of[present], minlength=n_pools).astype(np.int64)
    med = np.full(n_pools, np.nan)
    if not present.any():
        return med, count
    order = np.lexsort((values, pool_of))  # by pool, then value; NaN after every number
    ordered = values[order]
    first = np.searchsorted(pool_of[order], np.arange(n_pools, dtype=np.int64))
    has = count > 0
    upper = ordered[(first + count // 2)[has]]
    lower = ordered[(first + np.maximum(count - 1, 0) // 2)[has]]
    med[has] = np.where(count[has] % 2 == 1, upper, (lower + upper) / 2)
    return med, count
