"""The model's CPU per fleet-second on the sizing bench's load, in one process (issue 9, session 10).

``fleetloop bench sizing`` measures one daemon end to end, but on a machine shared by several
engineers its figure follows the load (a starved daemon folds larger cuts and decides fewer ticks).
This replays the same input without a broker or a clock: the load generator's records
(``fleetloop.bench.loadgen``: every node's telemetry once a second and ``--per-node`` calls per node
per second in 50 ms slices, four calls per task, no task ending here, so every task is let go as
handed off once quiet), decoded by the daemon's door into the twins (``decode_fast``) and folded one
slice at a time (``fold_telemetries`` / ``fold_outcomes``) with the daemon's collector settings.
It prints the CPU milliseconds per fleet-second of the decode, of the fold and of the fold's let-go
passes (a part of the fold), after ``--warmup``
fleet-seconds (the handoff horizon is learned and tasks start to leave after ~10 s).

``--ab`` alternates the fold's fast let-go pass (``FleetModel._let_go_workflows``) with its
statement (``_let_go_workflows_plain``) in the same process, ``--pairs`` times::

    nice -n 10 .venv/bin/python scripts/fold_ab.py --nodes 3000 --seconds 60 --warmup 20 --ab --pairs 2
"""

from __future__ import annotations

import argparse
import gc
import time
from types import SimpleNamespace
from typing import Any

from fleetloop.bench.decide import DAEMON_GEN0
from fleetloop.bench.loadgen import SLICES, Slices, bench_fleet, templates
from fleetloop.core.model.fleet import FleetModel
from fleetloop.daemon.observe.decode import Door, decode_fast
from fleetloop.daemon.runtime import tune_gc
from fleetloop.schemas.fast import OUTCOME_TWIN, TELEMETRY_TWIN

T0 = 1_767_225_600_000


def _slices(n_nodes: int, seconds: int, per_node: float) -> list[tuple[list[Any], list[Any]]]:
    fleet = bench_fleet(n_nodes)
    gen = Slices(fleet, templates(fleet, set(), 1), per_node)
    out = []
    for s in range(seconds):
        for k in range(SLICES):
            ts = T0 + s * 1000 + k * (1000 // SLICES)
            recs = [
                SimpleNamespace(topic=str(tp), partition=0, offset=i, key=key, value=v, timestamp=ts, tp=tp)
                for i, (tp, _, key, v) in enumerate(gen.records(k, ts))
            ]
            out.append(([r for r in recs if r.tp == 0], [r for r in recs if r.tp == 1]))
    return out


LET_GO_S = [0.0]  # CPU seconds inside the let-go pass (the wrapped form), timed fleet-seconds only


def _timed(form: Any) -> Any:
    def let_go(self: FleetModel, now: int) -> None:
        c0 = time.process_time()
        form(self, now)
        LET_GO_S[0] += time.process_time() - c0

    return let_go


def run(slices: list[tuple[list[Any], list[Any]]], warmup: int) -> dict[str, float]:
    door = Door()
    model = FleetModel()
    gc.collect()
    fold = dec = 0.0
    for j, (tel, out) in enumerate(slices):
        c0 = time.process_time()
        t = decode_fast(TELEMETRY_TWIN, tel, door).items
        o = decode_fast(OUTCOME_TWIN, out, door).items
        c1 = time.process_time()
        model.fold_telemetries(t)
        model.fold_outcomes(o)
        c2 = time.process_time()
        if j == warmup * SLICES - 1:
            LET_GO_S[0] = 0.0
        if j >= warmup * SLICES:
            dec += c1 - c0
            fold += c2 - c1
    timed = len(slices) / SLICES - warmup
    return {
        "decode_ms_per_fleet_s": round(dec / timed * 1000, 1),
        "fold_ms_per_fleet_s": round(fold / timed * 1000, 1),
        "let_go_ms_per_fleet_s": round(LET_GO_S[0] / timed * 1000, 1),
        "open_workflows": len(model.ledger.active),
        "handed_off": model.ledger.tasks_handed_off,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=3000)
    p.add_argument("--seconds", type=int, default=60)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--per-node", type=float, default=2.0)
    p.add_argument("--ab", action="store_true", help="alternate the fast let-go pass with its statement")
    p.add_argument("--pairs", type=int, default=2)
    args = p.parse_args()
    tune_gc(DAEMON_GEN0)
    slices = _slices(args.nodes, args.seconds, args.per_node)
    fast = FleetModel._let_go_workflows
    forms = {"fast": fast, "plain": FleetModel._let_go_workflows_plain} if args.ab else {"fast": fast}
    for _ in range(args.pairs):
        for name, form in forms.items():
            FleetModel._let_go_workflows = _timed(form)  # type: ignore[method-assign]
            try:
                print(name, run(slices, args.warmup), flush=True)
            finally:
                FleetModel._let_go_workflows = fast  # type: ignore[method-assign]


if __name__ == "__main__":
    main()
