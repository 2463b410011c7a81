"""Desired state -> a router's worker list, row by row (fleetloop/edges/actuate/worker_list/mapping.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fleetloop.edges.actuate.worker_list.mapping import (
    UNMAPPED,
    WorkerMap,
    WorkerMapError,
    desired_workers,
    load_worker_map,
    plan,
)
from fleetloop.router.state import DesiredState
from fleetloop.schemas.decisions import AutoscaleDecision
from tests.router.test_pick import breaker, env, routing

ROOT = Path(__file__).resolve().parents[2]
WMAP = WorkerMap({"p": {f"p/{i}": f"http://w{i}" for i in range(5)}})


def _want(*decisions: object, now: float = 1.0) -> dict[str, tuple[bool, str]]:
    st = DesiredState()
    for d in decisions:
        st.accept(d, 0.0)  # type: ignore[arg-type]
    return desired_workers(st, WMAP, now, 30.0)


def test_membership_rows() -> None:
    drain = AutoscaleDecision(
        entity="pool/p", reason="r", pool_id="p", current_nodes=4, desired_nodes=3, drain=("p/3",)
    )
    got = _want(
        routing("p", {"p/0": 0.5, "p/1": 0.0, "p/2": 0.3, "p/3": 0.2}),
        breaker("p/2", "open"),
        breaker("p/0", "half_open"),
        env(drain),
    )
    assert got == {
        "http://w0": (True, "half-open"),
        "http://w1": (False, "weight-zero"),
        "http://w2": (False, "breaker-open"),
        "http://w3": (False, "autoscale-drain"),
        "http://w4": (False, "not-a-member"),
    }


def test_stale_state_keeps_every_worker_and_never_ejects_all() -> None:
    assert {p for p, _ in _want(routing("p", {"p/0": 1.0}), now=31.0).values()} == {True}
    got = _want(routing("p", {"p/0": 1.0}), breaker("p/0"))
    assert got["http://w0"] == (True, "never-empty")  # the only member: its breaker is not honoured
    assert {got[f"http://w{i}"] for i in range(1, 5)} == {(False, "not-a-member")}


def test_fresh_state_that_would_remove_every_worker_keeps_the_named_ones_not_ejected() -> None:
    # it names none (a daemon that lost sight of the pool): every worker, as when stale
    assert set(_want(routing("p", {})).values()) == {(True, "never-empty")}
    got = _want(routing("p", {"p/0": 0.0, "p/1": 1.0, "p/2": 0.0}), breaker("p/1"))
    assert {url for url, (present, _) in got.items() if present} == {"http://w0", "http://w2"}
    assert got["http://w1"] == (False, "breaker-open")


def test_plan_adds_and_removes_only_differences() -> None:
    want = {"http://a": (True, "routing"), "http://b": (False, "breaker-open"), "http://c": (True, "routing")}
    assert plan(want, {"http://a", "http://b", "http://x"}) == [
        ("remove", "http://b", "breaker-open"),
        ("add", "http://c", "routing"),
    ]


def test_worker_map_errors_are_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "w.yaml"
    for text, msg in [
        ("pools: {}", "non-empty"),
        ("pools: {p: {p/0: ftp://x}}", "http"),
        ("pools: {p: {p/0: 'http://a', p/1: 'http://a'}}", "mapped twice"),
    ]:
        bad.write_text(text)
        with pytest.raises(WorkerMapError, match=msg) as exc:
            load_worker_map(bad)
        assert "\n" not in str(exc.value)


def test_readme_lists_what_a_worker_list_router_cannot_express() -> None:
    readme = (ROOT / "docs" / "integrations" / "routers.md").read_text()
    for name, why in UNMAPPED.items():
        assert f"| `{name}` | {why} |" in readme, name


async def test_actuator_adds_before_it_removes_so_the_list_never_empties() -> None:
    from fleetloop.edges.actuate.worker_list.actuator import WorkerListActuator

    class Recorder:
        """Stands in for a router's HTTP API and keeps its worker list (calls in order)."""

        def __init__(self) -> None:
            self.workers = {"http://w0"}
            self.calls: list[tuple[str, str, int]] = []

        async def list_workers(self) -> set[str]:
            return set(self.workers)

        async def add_worker(self, url: str) -> None:
            self.workers.add(url)
            self.calls.append(("add", url, len(self.workers)))

        async def remove_worker(self, url: str) -> None:
            self.workers.discard(url)
            self.calls.append(("remove", url, len(self.workers)))

    st = DesiredState()
    for d in (routing("p", {"p/0": 0.0, "p/1": 1.0}), breaker("p/0")):
        st.accept(d, 0.0)
    api = Recorder()
    act = WorkerListActuator(api, WMAP, st, fail_static_s=30.0, now=lambda: 1.0)  # type: ignore[arg-type]
    done = await act.reconcile()
    assert api.calls == [("add", "http://w1", 2), ("remove", "http://w0", 1)]
    assert [k for *_, k in done] == ["apply", "apply"]
    api.workers.add("http://w0")  # someone puts it back by hand
    again = await act.reconcile()
    assert [(a, u, k) for a, u, _, k in again] == [("remove", "http://w0", "drift")]
