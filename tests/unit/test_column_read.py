"""The table's one pass over the telemetry records (``NodeTable.numbers``) reads every numeric field
as the plain per-column reads do (``floats_plain`` / ``ints_plain`` / ``flag_plain``), bit for bit,
and raises where they raise: on the bench fleet, on hostile values (1e308, inf, NaN, -0.0, None,
integers past 2**53 and past int64, bools, integral and fractional floats in int fields) and on
generated rows."""

from __future__ import annotations

import contextlib
import math
from typing import Any

import numpy as np
import pytest
from fleetloop.bench.fleetgen import BASE_TS_MS, make_fleet, telemetry_at
from fleetloop.policies.columns import _TEL_NUMBERS, NodeTable
from fleetloop.schemas.fast import TELEMETRY_TWIN, TelemetryRec
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.unit.test_fold_batch import tel

INT_FIELDS = ("gpu_count", "queue_depth", "running_requests", "queued_prompt_tokens", "max_batch_tokens")


def table_of(tels: list[Any], now_ms: int = BASE_TS_MS + 60_000) -> NodeTable:
    n = len(tels)
    pools = sorted({t.pool_id for t in tels})
    return NodeTable(
        now_ms=now_ms,
        stale_after_ms=5_000,
        ids=[t.node_id for t in tels],
        tels=tels,
        consecutive=[0] * n,
        totals=np.zeros((n, 8)),
        ts=np.array([t.ts_ms for t in tels], dtype=np.int64),
        pool_ids=tuple(pools),
        bounds=dict.fromkeys(pools[:1], (0, n)),
    )


def outcome(fn: Any, name: str) -> Any:
    """What a read gives: its values bit for bit (as hex, with the dtype), or the exception's type."""
    try:
        got = fn(name)
    except (TypeError, ValueError, OverflowError) as e:
        return type(e).__name__
    values = [float(v).hex() if isinstance(v, float) else v for v in got.tolist()]
    return (str(got.dtype), got.shape, values)


def assert_reads_alike(tels: list[Any]) -> None:
    """Every numeric field, read through the one pass (a fresh table per field, so each read is the
    first) and read plainly, is the same."""
    plain = table_of(tels)
    # A flag's floats and ints are its booleans' (the table's rule for flags, unchanged).
    want_floats = {"draining": lambda name: plain.flag_plain(name).astype(np.float64)}
    want_ints = {"draining": lambda name: plain.flag_plain(name).astype(np.int64)}
    for name in _TEL_NUMBERS:
        floats_plain = want_floats.get(name, plain.floats_plain)
        ints_plain = want_ints.get(name, plain.ints_plain)
        assert outcome(table_of(tels).floats, name) == outcome(floats_plain, name), name
        assert outcome(table_of(tels).ints, name) == outcome(ints_plain, name), name
        if name == "draining":
            assert outcome(table_of(tels).flag, name) == outcome(plain.flag_plain, name), name
    # And once more on one table, every column after the first coming from the block.
    shared = table_of(tels)
    for name in _TEL_NUMBERS:
        floats_plain = want_floats.get(name, plain.floats_plain)
        ints_plain = want_ints.get(name, plain.ints_plain)
        assert outcome(shared.floats, name) == outcome(floats_plain, name), name
        assert outcome(shared.ints, name) == outcome(ints_plain, name), name
    assert outcome(shared.flag, "draining") == outcome(plain.flag_plain, "draining")
    warm = [t.weights_state == "warm" and not t.draining for t in tels]
    with contextlib.suppress(TypeError, ValueError):  # a draining value numpy cannot read as a bool
        assert table_of(tels).flag("warm").tolist() == warm


def test_the_bench_fleets_records_read_alike_and_in_one_pass() -> None:
    fleet = make_fleet(300, degraded_per_1000=40.0)
    models = list(telemetry_at(fleet, BASE_TS_MS + 1000))
    twins = [TELEMETRY_TWIN.of(t) for t in models]
    for tels in (models, twins):
        assert_reads_alike(tels)
        table = table_of(tels)
        assert table.numbers() is not None
        assert table.numbers() is table.numbers()  # built once


HOSTILE_FLOATS = (1e308, -1e308, math.inf, -math.inf, math.nan, -0.0, 0.0, 5e-324, None, 2.0**53 + 2)
HOSTILE_INTS = (0, -0.0, 1, True, False, 3.0, 1.5, -1.5, -0.5, 2.0**53 - 1.5)
HOSTILE_INTS += (2**53, 2**53 + 1, -(2**53) - 1, 2**63, -(2**63), 10**30, None)


@pytest.mark.parametrize("value", HOSTILE_FLOATS + HOSTILE_INTS)
@pytest.mark.parametrize("name", _TEL_NUMBERS)
def test_a_hostile_value_in_any_field_reads_alike(name: str, value: Any) -> None:
    tels = [tel(f"n{i}", "p0", BASE_TS_MS + i) for i in range(6)]
    tels[3] = tel("n3", "p0", BASE_TS_MS + 3, **{name: value})
    tels[5] = tel("n5", "p0", BASE_TS_MS + 5_000_000_000_000)  # far-future timestamp
    assert_reads_alike(tels)


def test_a_value_numpy_cannot_read_fails_only_its_own_column() -> None:
    tels = [tel(f"n{i}", "p0", BASE_TS_MS) for i in range(4)]
    tels[1] = tel("n1", "p0", BASE_TS_MS, hbm_free_gib=10**400, gpu_count=(1, 2))
    table = table_of(tels)
    assert table.numbers() is None
    assert table.floats("kv_cache_used_frac").tolist() == [t.kv_cache_used_frac for t in tels]
    assert table.ints("queue_depth").tolist() == [t.queue_depth for t in tels]
    with pytest.raises(OverflowError):
        table.floats("hbm_free_gib")
    assert_reads_alike(tels)
    # A sequence in every row would give numpy a third dimension: refused, read per column.
    same = [tel(f"n{i}", "p0", BASE_TS_MS, gpu_count=(1, 2)) for i in range(3)]
    assert table_of(same).numbers() is None
    assert_reads_alike(same)
    pairs = [tel(f"n{i}", "p0", BASE_TS_MS, **dict.fromkeys(_TEL_NUMBERS, (1, 2))) for i in range(3)]
    assert table_of(pairs).numbers() is None  # every field a pair: numpy would add a dimension
    assert table_of(pairs).floats("hbm_free_gib").shape == (3, 2)  # as the plain read gives


def test_an_empty_table_reads_empty_columns() -> None:
    table = table_of([])
    assert table.numbers() is not None
    for name in _TEL_NUMBERS:
        assert table.floats(name).shape == (0,)
        assert table.ints(name).shape == (0,)


_NUMBER = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.sampled_from([-0.0, 2.0**53, 2.0**53 + 2, 2.0**63, 1e308])
)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.dictionaries(st.sampled_from(_TEL_NUMBERS), _NUMBER, max_size=4), min_size=1, max_size=8))
def test_generated_rows_read_alike(rows: list[dict[str, Any]]) -> None:
    tels: list[TelemetryRec] = [tel(f"n{i}", "p0", BASE_TS_MS + i, **kw) for i, kw in enumerate(rows)]
    assert_reads_alike(tels)


def test_ints_of_a_field_are_read_on_their_own_past_2_53() -> None:
    """The guard that keeps ints exact: 2**53 + 1 is not a double, so it is read again on its own."""
    tels = [tel("n0", "p0", BASE_TS_MS, queued_prompt_tokens=2**53 + 1)]
    assert table_of(tels).ints("queued_prompt_tokens").tolist() == [2**53 + 1]
    assert table_of(tels).floats("queued_prompt_tokens").tolist() == [float(2**53 + 1)]
