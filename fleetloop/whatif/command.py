"""``fleetloop whatif``: a recorded incident, simulated under the recorded policy and a candidate.

``fleetloop whatif --bootstrap-servers HOST:PORT --from T --to T --policy CANDIDATE.yaml
[--recorded-policy FILE] [--scenario-out FILE] [--report DIR] [--seed N] [--json]``

1. Reads ``fleet.requests`` and ``fleet.telemetry`` (the replay's topic reader, same connection and
   security flags), and the policy the window ran: the stamp most of its decisions on
   ``control.decisions`` carry, resolved through ``control.policy``, ``control.policy.active`` and
   the built-in policies; with no decision in the window, the document every group had active at
   its start on ``control.policy.active`` (``--recorded-policy FILE`` names it instead).
2. Derives the window's workload, fleet and faults (:mod:`fleetloop.whatif.derive`, pure) and writes
   them as a scenario file (``--scenario-out``; default ``DIR/scenario.yaml`` with ``--report``, else
   ``whatif-scenario.yaml`` in the current directory, which is never overwritten: a file there from
   an earlier run is refused up front, since the user did not name it), loaded back through the
   simulator's own loader.
3. Runs ``fleetloop sim`` in process on it under the recorded policy and the candidate, same seed:
   KPI rows, the candidate's delta in cost per successful task, and the fidelity check (the
   recorded-policy run against what the window observed, signed errors). ``--report DIR`` writes
   the simulator's HTML report of both runs with the fidelity table on top.

Times: epoch milliseconds, ISO-8601 with a zone, ``beginning`` (the first recorded call or report)
or ``end`` (just after the last recorded task started). Bad input (an empty or reversed window, a
missing topic, nothing recorded in the window, a bad policy file) is one line on stderr and exit
code 2.
"""

from __future__ import annotations

import argparse
import asyncio
import html
import math
import sys
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import orjson
import yaml
from pydantic import BaseModel, ValidationError
from rich.table import Table

from fleetloop import term
from fleetloop.daemon.cli_common import UsageError, connection_from, quiet_client_logs
from fleetloop.daemon.replay.command import _known_policies, parse_time, read_topic
from fleetloop.kafka_security import Bootstrap, bootstrap_arg, error_text, shown
from fleetloop.policies.registry import CompiledPolicy, compile_policy, load_policy
from fleetloop.schemas.control import ActivePolicy
from fleetloop.schemas.decisions import Decision
from fleetloop.schemas.policy import PolicyDocument
from fleetloop.schemas.requests import RequestOutcome
from fleetloop.schemas.telemetry import NodeTelemetry
from fleetloop.schemas.topics import DECISIONS, POLICY, POLICY_ACTIVE, REQUESTS, TELEMETRY, topic_name
from fleetloop.sim.report import Run, write_report
from fleetloop.sim.runner import RunResult, run
from fleetloop.sim.scenario import Scenario, ScenarioError, load_scenario
from fleetloop.user_input import check_seed, output_dir, output_file
from fleetloop.whatif.compare import KPIS, comparison, fidelity, kpis, observed_kpis
from fleetloop.whatif.derive import Derived, DeriveError, derive, engine_arg

PROG = "fleetloop whatif"
DEFAULT_SCENARIO_OUT = "whatif-scenario.yaml"
_M = TypeVar("_M", bound=BaseModel)


def register(sub: Any) -> None:
    p = sub.add_parser(
        "whatif",
        help="simulate a recorded window under the recorded policy and a candidate, side by side",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    bootstrap_arg(p, required=True)
    p.add_argument("--from", dest="from_", required=True, metavar="TIME", help="window start (event time)")
    p.add_argument("--to", required=True, metavar="TIME", help="window end (event time)")
    p.add_argument("--policy", required=True, metavar="FILE", help="the candidate policy document")
    p.add_argument(
        "--recorded-policy",
        metavar="FILE",
        help="the policy the window ran (default: the one stamped on its decisions)",
    )
    p.add_argument(
        "--scenario-out",
        metavar="FILE",
        help=f"where to write the derived scenario (default: DIR/scenario.yaml with --report, else "
        f"{DEFAULT_SCENARIO_OUT} in the current directory, refused if it exists)",
    )
    p.add_argument("--report", metavar="DIR", help="write index.html and PNG timelines of both runs to DIR")
    p.add_argument(
        "--seed", type=int, default=1, help="the simulator's seed, the same for both runs (default 1)"
    )
    p.add_argument(
        "--seeds",
        type=int,
        default=1,
        metavar="N",
        help="run both policies on N seeds from --seed and report means (deltas paired by seed; default 1)",
    )
    p.add_argument(
        "--engine",
        action="append",
        default=[],
        metavar="[POOL=]ENGINE[:FAMILY]",
        help="the serving engine a pool ran, as scrape --runtime read it (vllm, sglang, trtllm; "
        "FAMILY e.g. v1 or 0.6); without POOL= every pool; repeatable (default: vllm v1, noted)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=cmd_whatif)


def _time(text: str, *, default: int | None) -> int | None:
    return parse_time(text, default=default, verb="whatif")


def _progress_line(msg: str) -> None:
    """Progress, on a terminal only: piped, stderr holds nothing but an error's one line."""
    if sys.stderr.isatty():
        sys.stderr.write(f"{PROG}: {msg}\n")
        sys.stderr.flush()


def cmd_whatif(args: argparse.Namespace) -> int:
    quiet_client_logs()
    check_seed(args.seed, prog=PROG)
    if not 1 <= args.seeds <= 100:
        raise UsageError(f"{PROG}: --seeds must be between 1 and 100, got {args.seeds}")
    from_ms = _time(args.from_, default=None)
    to_ms = _time(args.to, default=None)
    if from_ms is not None and to_ms is not None and to_ms <= from_ms:
        raise UsageError(f"{PROG}: --from {args.from_} is not before --to {args.to}: an empty window")
    engines: dict[str, tuple[str, str | None]] = {}
    for text in args.engine:
        try:
            pool, given = engine_arg(text)
        except ValueError as exc:
            raise UsageError(f"{PROG}: --engine: {exc}") from None
        engines[pool] = given
    candidate = load_policy(args.policy)  # a bad file: one line, exit 2 (PolicyError)
    recorded_override = load_policy(args.recorded_policy) if args.recorded_policy else None
    out = _scenario_out(args)  # output paths before the broker is read and anything runs
    _progress_line(f"reading the recorded topics at {shown(connection_from(args))} ...")
    rec = asyncio.run(_read(connection_from(args), args.topic_prefix))
    lo, hi = rec.span()
    from_ms = lo if from_ms is None else from_ms
    to_ms = hi if to_ms is None else to_ms
    if to_ms <= from_ms:
        raise UsageError(f"{PROG}: the window {args.from_} .. {args.to} is empty ({from_ms} .. {to_ms} ms)")
    recorded, source, policy_notes = _recorded_policy(rec, recorded_override, from_ms, to_ms)
    try:
        name = f"whatif {datetime.fromtimestamp(from_ms / 1000, tz=UTC):%Y-%m-%dT%H:%M:%SZ}"
        derived = derive(
            rec.outcomes,
            rec.telemetry,
            from_ms=from_ms,
            to_ms=to_ms,
            name=name,
            seed=args.seed,
            engines=engines,
        )
    except DeriveError as exc:
        raise UsageError(f"{PROG}: {exc}") from None
    notes = [*rec.notes, *policy_notes, *derived.notes]
    scenario = _write_scenario(out, derived)
    per_seed: list[list[tuple[str, CompiledPolicy, RunResult, dict[str, Any]]]] = []
    for seed in range(args.seed, args.seed + args.seeds):
        pair = []
        for label, policy in (("recorded", recorded), ("candidate", candidate)):
            _progress_line(
                f"simulating {scenario.duration_s:.0f} s, {label} policy {_name(policy)}, seed {seed}"
            )
            result = run(scenario, policy, seed=seed, progress=_progress)
            if sys.stderr.isatty():
                sys.stderr.write("\r\033[K")
            pair.append((label, policy, result, result.to_json(str(out))))
        per_seed.append(pair)
    payload = _payload(args, from_ms, to_ms, out, derived, notes, recorded, source, candidate, per_seed)
    if args.report:  # timelines of the first seed's pair; the tables above them are the means
        payload["report"] = str(_report(args.report, scenario, per_seed[0], payload))
    if args.json:
        sys.stdout.write(orjson.dumps(payload).decode() + "\n")
    else:
        _print(payload)
    return 0


def _progress(virtual_s: float, horizon_s: float) -> None:
    if sys.stderr.isatty():
        sys.stderr.write(f"\r  {virtual_s:,.0f} s virtual")
        sys.stderr.flush()


def _name(p: CompiledPolicy) -> str:
    return f"{p.stamp.name} v{p.stamp.version}"


# -- reading ------------------------------------------------------------------------------------------


class _Recorded:
    def __init__(self) -> None:
        self.outcomes: list[RequestOutcome] = []
        self.telemetry: list[NodeTelemetry] = []
        self.decisions: list[Decision] = []
        self.policy_records: list[Any] = []
        self.actives: list[ActivePolicy] = []
        self.notes: list[str] = []
        self.requests_topic = REQUESTS

    def span(self) -> tuple[int, int]:
        """``beginning``: the first call's send time or report's interval start; ``end``: just after
        the last task's first call (the last arrival: a recording's drain after arrivals stopped
        is not quiet time to average the arrival rate over)."""
        starts = [o.ts_ms - o.e2e_ms for o in self.outcomes] + [
            t.ts_ms - t.interval_ms for t in self.telemetry
        ]
        arrivals = [o.ts_ms - o.e2e_ms for o in self.outcomes if o.step_index == 0 and o.attempt == 0]
        if not arrivals:
            raise UsageError(f"{PROG}: no task recorded on {self.requests_topic} (no call at step 0)")
        return math.floor(min(starts)), math.floor(max(arrivals)) + 1


async def _read(bootstrap: Bootstrap, prefix: str) -> _Recorded:
    rec = _Recorded()
    rec.requests_topic = topic_name(prefix, REQUESTS)

    async def read(logical: str, *, required: bool) -> list[Any]:
        parts = await read_topic(bootstrap, prefix, logical, verb="whatif", optional=not required)
        return [r for rs in parts.values() for r in rs]

    try:
        raw_out = await read(REQUESTS, required=True)
        raw_tel = await read(TELEMETRY, required=True)
        raw_dec = await read(DECISIONS, required=False)
        raw_active = await read(POLICY_ACTIVE, required=False)
        rec.policy_records = await read(POLICY, required=False) + raw_active
    except UsageError:
        raise
    except Exception as exc:  # one line for the user, whatever the client raised
        raise UsageError(f"{PROG}: cannot read from {shown(bootstrap)}: {error_text(exc)}") from None
    rec.outcomes, bad_out = _decode(raw_out, RequestOutcome)
    rec.outcomes = [o for o in rec.outcomes if o.diverted_to is None]  # a moved call's copy is no call
    rec.telemetry, bad_tel = _decode(raw_tel, NodeTelemetry)
    rec.decisions, bad_dec = _decode(raw_dec, Decision)
    rec.actives, _ = _decode(raw_active, ActivePolicy)  # its newest record per group is what counts
    bad = bad_out + bad_tel + bad_dec
    if bad:
        rec.notes.append(f"{bad} malformed record(s) skipped (the daemon dead-letters them too)")
    return rec


def _decode(records: list[Any], model: type[_M]) -> tuple[list[_M], int]:
    """The records that validate, and how many did not (the daemon dead-letters those too)."""
    out: list[_M] = []
    bad = 0
    for r in records:
        try:
            out.append(model.model_validate_json(r.value or b""))
        except ValidationError:
            bad += 1
    return out, bad


def _recorded_policy(
    rec: _Recorded, override: CompiledPolicy | None, from_ms: int, to_ms: int
) -> tuple[CompiledPolicy, str, list[str]]:
    """The policy most of the window's enforced decisions were stamped with."""
    counts = Counter(
        d.policy.hash for d in rec.decisions if from_ms <= d.ts_ms < to_ms and d.policy.mode != "shadow"
    )
    notes: list[str] = []
    if override is not None:
        if counts and override.stamp.hash not in counts:
            notes.append(
                f"--recorded-policy {_name(override)} ({override.stamp.hash}) stamped no decision in the "
                f"window (its decisions carry {', '.join(sorted(counts))})"
            )
        return override, "--recorded-policy", notes
    if not counts:
        active = active_at(rec.actives, from_ms)
        if active is None:
            raise UsageError(
                f"{PROG}: no decision recorded on control.decisions in the window and no single policy "
                "active then on control.policy.active, so the policy it ran is unknown; name it with "
                "--recorded-policy FILE"
            )
        notes.append("no decision recorded in the window: the recorded policy is the one active at its start")
        return compile_policy(active), "control.policy.active", notes
    known = _known_policies(rec.policy_records)
    (top, n), *rest = counts.most_common()
    if top not in known:
        raise UsageError(
            f"{PROG}: the recorded policy (hash {top}) is neither built in nor on control.policy or "
            "control.policy.active; name it with --recorded-policy FILE"
        )
    if rest:
        others = ", ".join(f"{h} ({k} decisions)" for h, k in rest)
        notes.append(
            f"the window spans a policy change: {n} decisions under {top}, also {others}; "
            f"the simulation runs {_name(known[top])} throughout"
        )
    return known[top], "control.decisions", notes


def active_at(actives: list[ActivePolicy], at_ms: int) -> PolicyDocument | None:
    """The document every daemon group had active at ``at_ms`` (each group's newest record, its
    latest activation from at or before then), or None when none is known or the groups differ."""
    newest: dict[str, ActivePolicy] = {}
    for a in actives:
        newest[a.group] = a  # in offset order: the last record of a group is its newest
    docs = {}
    for a in newest.values():
        before = [h for h in a.history if h.from_ts_ms <= at_ms]
        if before:
            doc = before[-1].document
            docs[compile_policy(doc).stamp.hash] = doc
    return next(iter(docs.values())) if len(docs) == 1 else None


# -- writing and running ---------------------------------------------------------------------------------


def _scenario_out(args: argparse.Namespace) -> Path:
    """Where the derived scenario goes, checked (with ``--report``) before anything runs. A path
    the user named (``--scenario-out``, or the ``--report`` directory it goes into) may be replaced;
    the default in the current directory may not: a second whatif there would otherwise silently
    overwrite the first one's scenario, which its printed rerun command still names."""
    if args.report:
        output_dir(args.report, flag="--report", prog=PROG)
    if args.scenario_out:
        return output_file(args.scenario_out, flag="--scenario-out", prog=PROG, make_parents=True)
    if args.report:
        return Path(args.report) / "scenario.yaml"
    out = output_file(DEFAULT_SCENARIO_OUT, flag="--scenario-out", prog=PROG)
    if out.exists() or out.is_symlink():
        raise UsageError(
            f"{PROG}: {DEFAULT_SCENARIO_OUT} exists here (an earlier whatif's?) and is not replaced "
            "unasked: name the derived scenario's file with --scenario-out FILE"
        )
    return out


def _write_scenario(path: Path, derived: Derived) -> Scenario:
    text = (
        "# Derived by `fleetloop whatif` from a recorded window; see fleetloop/whatif/derive.py for how\n"
        "# each field was estimated. Rerun with: fleetloop sim --scenario THIS_FILE\n"
        + yaml.safe_dump(derived.document, sort_keys=False, default_flow_style=None, width=100)
    )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    except OSError as exc:
        raise UsageError(f"{PROG}: cannot write the scenario to {path}: {exc.strerror or exc}") from None
    try:
        return load_scenario(path)  # the simulator's own loader: the file is what runs
    except ScenarioError as exc:  # a derivation bug, not the user's: still one line
        raise UsageError(f"{PROG}: the derived scenario does not load: {exc}") from None


def _policy_json(p: CompiledPolicy) -> dict[str, Any]:
    return {"name": p.stamp.name, "version": p.stamp.version, "hash": p.stamp.hash}


def _payload(  # noqa: PLR0917 - one call site, every argument named there
    args: argparse.Namespace,
    from_ms: int,
    to_ms: int,
    out: Path,
    derived: Derived,
    notes: list[str],
    recorded: CompiledPolicy,
    source: str,
    candidate: CompiledPolicy,
    per_seed: list[list[tuple[str, CompiledPolicy, RunResult, dict[str, Any]]]],
) -> dict[str, Any]:
    rec_runs = [pair[0][3] for pair in per_seed]
    cand_runs = [pair[1][3] for pair in per_seed]
    kpi = comparison(rec_runs, cand_runs)
    sc = derived.scenario
    return {
        "window": {"from_ms": from_ms, "to_ms": to_ms, "seconds": round((to_ms - from_ms) / 1000.0, 3)},
        "scenario": {
            "file": str(out),
            "pools": len(sc.pools),
            "tenants": len(sc.tenants),
            "workload": len(sc.workload),
            "faults": [f.model_dump(exclude_none=True) for f in sc.faults],
            "document": derived.document,
        },
        "notes": notes,
        "seeds": [r["seed"] for r in rec_runs],
        "recorded_policy": {**_policy_json(recorded), "source": source},
        "candidate_policy": _policy_json(candidate),
        "observed": {**derived.observed.to_json(), "kpis": observed_kpis(derived.observed)},
        "kpis": kpi,
        "delta_cost_per_successful_task_usd": kpi["cost_per_successful_task_usd"]["delta"],
        "fidelity": fidelity(derived.observed, rec_runs),
        "runs": {"recorded": rec_runs[0], "candidate": cand_runs[0]},
        "per_seed": [
            {"seed": r["seed"], "recorded": kpis(r), "candidate": kpis(c)}
            for r, c in zip(rec_runs, cand_runs, strict=True)
        ],
        "report": None,
    }


# -- output ------------------------------------------------------------------------------------------


def _fmt(key: str, v: Any, *, signed: bool = False) -> str:
    if v is None:
        return "-"
    sign = "+" if signed else ""
    if key in ("task_success", "p0_success"):
        return f"{v * 100:{sign}.2f} pp" if signed else f"{v:.2%}"
    if key == "cost_per_successful_task_usd":
        return f"{'-' if v < 0 else '+' if signed else ''}${abs(v):.6f}"
    if key == "ttft_p99_ms":
        return f"{v:{sign},.0f}"
    return f"{v:{sign}d}" if isinstance(v, int) else f"{v:{sign}.1f}"


def _seeds(seeds: list[int]) -> str:
    return f"seed {seeds[0]}" if len(seeds) == 1 else f"means over seeds {seeds[0]}-{seeds[-1]}"


def _rel(v: float | None) -> str:
    return "-" if v is None else f"{v:+.1%}"


def _print(p: dict[str, Any]) -> None:
    out = term.console()
    w = p["window"]
    rec, cand = p["recorded_policy"], p["candidate_policy"]
    obs = p["observed"]["kpis"]
    t = Table(
        title=f"fleetloop whatif: {w['seconds']:.0f} s window, recorded {rec['name']} v{rec['version']} "
        f"vs candidate {cand['name']} v{cand['version']} ({_seeds(p['seeds'])})"
    )
    several = len(p["seeds"]) > 1
    cols = ["KPI", "observed", "sim: recorded", "sim: candidate", "candidate - recorded"]
    for col in [*cols, "by seed"] if several else cols:
        t.add_column(col, justify="left" if col == "KPI" else "right")
    for key, label in KPIS:
        row = p["kpis"][key]
        cells = [
            label,
            _fmt(key, obs[key]),
            _fmt(key, row["recorded"]),
            _fmt(key, row["candidate"]),
            _fmt(key, row["delta"], signed=True),
        ]
        if several:
            lo, hi = (_fmt(key, row[k], signed=True).removesuffix(" pp") for k in ("delta_min", "delta_max"))
            cells.append(f"{lo}..{hi}")
        t.add_row(*cells)
    out.print(t)
    f = Table(
        title="fidelity: the recorded policy simulated vs what the window observed (simulated - observed)"
    )
    for col in ("figure", "observed", "simulated", "error", "relative"):
        f.add_column(col, justify="left" if col == "figure" else "right")
    labels = dict(KPIS)
    for key, row in p["fidelity"].items():
        f.add_row(
            labels[key],
            _fmt(key, row["observed"]),
            _fmt(key, row["simulated"]),
            _fmt(key, row["error"], signed=True),
            _rel(row.get("relative_error")),
        )
    out.print(f)
    o = p["observed"]
    out.print(
        f"window: {o['tasks_started']} tasks ({o['tasks_succeeded']} succeeded, {o['tasks_failed']} failed, "
        f"{o['tasks_unresolved']} unresolved); fleet cost from {o['cost_source']}"
    )
    sc = p["scenario"]
    faults = ", ".join(
        f"{x['kind']} {x.get('node') or x.get('pool')} at {x['at_s']:g} s" for x in sc["faults"]
    )
    out.print(
        f"scenario: {sc['file']} ({sc['pools']} pools, {sc['workload']} workloads, "
        f"faults: {faults or 'none'}); rerun: fleetloop sim --scenario {sc['file']}"
    )
    for n in p["notes"]:
        out.print(f"[dim]note: {n}[/dim]")
    if p["report"]:
        out.print(f"report: {p['report']}")


def _report(
    directory: str,
    scenario: Scenario,
    runs: list[tuple[str, CompiledPolicy, RunResult, dict[str, Any]]],
    p: dict[str, Any],
) -> Path:
    labels = dict(KPIS)
    rows = "".join(
        f"<tr><th>{html.escape(labels[k])}</th><td>{html.escape(_fmt(k, r['observed']))}</td>"
        f"<td>{html.escape(_fmt(k, r['simulated']))}</td>"
        f"<td>{html.escape(_fmt(k, r['error'], signed=True))}</td>"
        f"<td>{html.escape(_rel(r.get('relative_error')))}</td></tr>"
        for k, r in p["fidelity"].items()
    )
    kpi_rows = "".join(
        f"<tr><th>{html.escape(label)}</th><td>{html.escape(_fmt(k, p['observed']['kpis'][k]))}</td>"
        f"<td>{html.escape(_fmt(k, p['kpis'][k]['recorded']))}</td>"
        f"<td>{html.escape(_fmt(k, p['kpis'][k]['candidate']))}</td>"
        f"<td>{html.escape(_fmt(k, p['kpis'][k]['delta'], signed=True))}</td></tr>"
        for k, label in KPIS
    )
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in p["notes"]) or "<li>none</li>"
    w = p["window"]
    preface = (
        f"<h2>What-if over the recorded window {w['from_ms']} .. {w['to_ms']} "
        f"(epoch ms, {w['seconds']:g} s)</h2>"
        "<table><tr><th>KPI</th><th>observed</th><th>sim: recorded</th><th>sim: candidate</th>"
        f"<th>candidate - recorded</th></tr>{kpi_rows}</table>"
        "<h3>Fidelity (simulated under the recorded policy - observed)</h3>"
        "<table><tr><th>figure</th><th>observed</th><th>simulated</th><th>error</th><th>relative</th></tr>"
        f"{rows}</table><h3>How the scenario was derived: notes</h3><ul>{notes}</ul>"
        f"<p>scenario file: {html.escape(p['scenario']['file'])}</p>"
    )
    labelled = [Run(f"{label}: {_name(policy)}", result, data) for label, policy, result, data in runs]
    return write_report(directory, scenario, labelled, preface_html=preface)
