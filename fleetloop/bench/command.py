"""``fleetloop bench <name>``: registers the ``bench`` group and one subcommand per bench module."""

from __future__ import annotations

from typing import Any

from fleetloop.bench import (
    checkpoint,
    decide,
    fleet,
    fuzz,
    ingest,
    latency,
    results,
    rollup,
    router,
    sizing,
    soak,
    stack,
)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("bench", help="benchmarks that print figures (ratios from the same run)")
    sub = p.add_subparsers(dest="bench", required=True, parser_class=type(p))
    # Each bench module registers one subcommand. Keep this list sorted.
    checkpoint.register(sub)
    decide.register(sub)
    fleet.register(sub)
    fuzz.register(sub)
    ingest.register(sub)
    latency.register(sub)
    results.register(sub)
    rollup.register(sub)
    router.register(sub)
    sizing.register(sub)
    soak.register(sub)
    stack.register(sub)
