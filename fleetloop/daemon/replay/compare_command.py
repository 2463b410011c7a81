"""``fleetloop policy compare``: how the shadow policy's decisions differ from the enforced ones.

Reads ``control.decisions`` (what the enforcing policy decided) and ``control.shadow`` (what the
shadow policy decided on the same ticks), pairs them by tick, pool and key, and reports per kind and
entity how often and how far they differ (:mod:`.compare`). A tidy table, or ``--json``.

The header names, per side, the policies that decided the paired ticks, each with its ticks
(``ticks A-B: NAME vN (HASH), K ticks``), read from those ticks' own records.

Where the shadow starts. The daemon starts a shadow, on each pool, from the enforcing policy's
state at its first tick (:class:`fleetloop.core.shard.Shard`), as applying the document would
(sections with the same algorithm keep their state). We chose that over separating, here, what
the shadow inherited from what the candidate changed: a shadow started empty answers another
question (what a restart with no state would decide), and no rule read off the decisions can tell
a breaker the candidate's parameters close from one the empty start forgot; started from the
enforced state, every difference is the candidate's, from the first paired tick. A breaker held on
one side only is closed on the other (change-only records: a node that is not closed is sent every
tick, and the shadow re-sends a closed node it inherited only at its keyframe).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from pydantic import ValidationError
from rich.table import Table

from fleetloop import term
from fleetloop.daemon.cli_common import UsageError, connection_from, quiet_client_logs
from fleetloop.daemon.replay.command import parse_time, read_topic
from fleetloop.daemon.replay.compare import UNITS, Comparison, compare
from fleetloop.daemon.replay.replay import stretch_label
from fleetloop.kafka_security import bootstrap_arg, error_text, shown
from fleetloop.schemas.decisions import Decision
from fleetloop.schemas.topics import DECISIONS, SHADOW, topic_name


def register(pol_sub: Any) -> None:
    c = pol_sub.add_parser(
        "compare",
        help="how often and how far the shadow policy's decisions differ from the enforced ones",
        description="Pair control.shadow with control.decisions by tick, pool and decision key, "
        "ignoring stamps, reasons and inputs. Routing: total-variation distance of the weights; "
        "breaker: state; autoscale: desired nodes; admission: shed thresholds; retry budget: "
        "ratio; batching: token cap.",
    )
    bootstrap_arg(c, required=True)
    c.add_argument(
        "--from",
        dest="from_",
        default="beginning",
        metavar="TIME",
        help="first tick compared: epoch ms, ISO-8601 with a zone, or 'beginning' (default)",
    )
    c.add_argument("--to", default="end", metavar="TIME", help="last tick compared (default: 'end')")
    c.add_argument(
        "--window", metavar="FROM..TO", help="the same as --from FROM --to TO (either side may be empty)"
    )
    c.add_argument(
        "--limit", type=int, default=30, metavar="N", help="entities listed in the table (default 30)"
    )
    c.add_argument("--json", action="store_true", help="one JSON object on stdout with every entity")
    c.set_defaults(handler=cmd_compare)


def _window(args: argparse.Namespace) -> tuple[str, str]:
    if args.window is None:
        return args.from_, args.to
    if ".." not in args.window:
        raise UsageError(f"fleetloop policy compare: --window wants FROM..TO, got {args.window!r}")
    lo, hi = args.window.split("..", 1)
    return lo or "beginning", hi or "end"


def cmd_compare(args: argparse.Namespace) -> int:
    quiet_client_logs()
    if args.limit < 0:
        raise UsageError("fleetloop policy compare: --limit must be >= 0")
    lo, hi = _window(args)
    from_ms = parse_time(lo, default=0, verb="policy compare") or 0
    to_ms = parse_time(hi, default=None, verb="policy compare")
    if to_ms is not None and to_ms < from_ms:
        raise UsageError(f"fleetloop policy compare: {lo} is after {hi}: an empty window")
    conn = connection_from(args)

    async def read() -> tuple[list[Decision], list[Decision]]:
        try:
            enforced = await read_topic(conn, args.topic_prefix, DECISIONS, verb="policy compare")
            shadow = await read_topic(conn, args.topic_prefix, SHADOW, verb="policy compare")
        except UsageError:
            raise
        except Exception as exc:
            raise UsageError(
                f"fleetloop policy compare: cannot read from {shown(conn)}: {error_text(exc)}"
            ) from None
        return _decisions(enforced), _decisions(shadow)

    enforced, shadow = asyncio.run(read())
    if not shadow:
        raise UsageError(
            f"fleetloop policy compare: no shadow decisions on {topic_name(args.topic_prefix, SHADOW)} "
            "(apply a document with spec.mode: shadow first)"
        )
    result = compare(enforced, shadow, from_ms=from_ms, to_ms=to_ms)
    if result.ticks_paired == 0:
        raise UsageError(
            f"fleetloop policy compare: no tick between {lo} and {hi} was decided by both the enforcing "
            "and the shadow policy"
        )
    if args.json:
        sys.stdout.write(json.dumps({"window": {"from": lo, "to": hi}, **result.as_json()}) + "\n")
    else:
        _print(result, args.limit)
    return 0


def _decisions(parts: dict[int, list[Any]]) -> list[Decision]:
    out = []
    for records in parts.values():
        for r in records:
            try:
                out.append(Decision.model_validate_json(r.value or b""))
            except ValidationError:
                continue  # not a decision (a foreign record): nothing to compare
    return out


def stretch_lines(ticks: dict[tuple[str, int, str], list[int]]) -> list[str]:
    """``ticks A-B: NAME vN (HASH), K ticks`` per policy, in the order of their first tick."""
    spans = sorted(ticks.items(), key=lambda kv: (kv[1][0], kv[0]))
    return [stretch_label(stamp, a, b, k) for stamp, (a, b, k) in spans]


def _fmt(x: float) -> str:
    return f"{x:.4f}".rstrip("0").rstrip(".") if x else "0"


def _print(c: Comparison, limit: int) -> None:
    out = term.console()
    if not out.is_terminal:  # a pipe or a file: wide enough that entity names are not cut
        out = term.console(width=160)
    out.print(f"{c.ticks_paired} ticks paired", highlight=False)
    for side, ticks in (("shadow", c.shadow_ticks), ("enforced", c.enforced_ticks)):
        for line in stretch_lines(ticks):
            out.print(f"  {side:<8} {line}", highlight=False, markup=False)
    t = Table()
    for col, just in (
        ("kind", "left"),
        ("compared", "right"),
        ("differ", "right"),
        ("differ %", "right"),
        ("mean distance", "right"),
        ("max distance", "right"),
        ("unit", "left"),
        ("most common", "left"),
    ):
        t.add_column(col, justify=just)  # type: ignore[arg-type]
    for kind, tally in sorted(c.by_kind.items()):
        j = tally.as_json()
        t.add_row(
            kind,
            str(j["compared"]),
            str(j["differ"]),
            f"{100 * j['differ_frac']:.1f}",
            _fmt(j["distance_mean"]),
            _fmt(j["distance_max"]),
            UNITS.get(kind, ""),
            j["most_common"],
        )
    out.print(t)
    differing = sorted(
        ((k, e), tally) for (k, e), tally in c.by_entity.items() if tally.differ or tally.only_shadow
    )
    differing.sort(key=lambda item: (-item[1].differ, item[0]))
    if differing and limit:
        et = Table(title=f"entities that differ ({len(differing)}; the first {min(limit, len(differing))})")
        for col in ("kind", "entity", "compared", "differ", "mean distance", "max distance", "most common"):
            et.add_column(col)
        for (kind, entity), tally in differing[:limit]:
            j = tally.as_json()
            et.add_row(
                kind,
                entity,
                str(j["compared"]),
                str(j["differ"]),
                _fmt(j["distance_mean"]),
                _fmt(j["distance_max"]),
                j["most_common"],
            )
        out.print(et)
    elif not differing:
        out.print("no entity differs")
    if c.ticks_enforced_only or c.ticks_shadow_only:
        out.print(
            f"ticks decided by one policy only (not compared): enforced {c.ticks_enforced_only}, "
            f"shadow {c.ticks_shadow_only}"
        )
