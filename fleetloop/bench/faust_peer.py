"""The peer in ``fleetloop bench ingest``: a faust-streaming app doing per-pool aggregation.

Run as its own process (faust owns its worker and event loop)::

    python -m fleetloop.bench.faust_peer BOOTSTRAP TELEMETRY_TOPIC REQUESTS_TOPIC EVENTS RESULT_FILE

What a Python team would write with faust-streaming, the Python stream processor: two typed ``faust.Record``
streams (faust decodes JSON into them), one agent per topic folding each record into per-pool
aggregates (telemetry: reports, queue depth, KV use, cost; outcomes: calls, ok, failures, retries,
tokens). The aggregates live in process memory, not in a faust Table: a Table adds a changelog
topic produced on every update, so this is the faster of the two ways faust offers. It counts from
its first record to the ``EVENTS``-th and writes one JSON object to ``RESULT_FILE`` (faust sends
stdout to its log): events, wall seconds and CPU seconds over that span. Needs the
``faust-streaming`` package (the ``bench`` extra, also in ``dev``).
"""

from __future__ import annotations

import os
import sys
import uuid
from collections import defaultdict
from typing import Any, NoReturn

import orjson

from fleetloop import clock


def main(argv: list[str]) -> NoReturn:
    import faust  # noqa: PLC0415 - optional: the bench extra (faust-streaming)

    bootstrap, tel_topic, req_topic, total_s, result_path = argv
    total = int(total_s)

    class Telemetry(faust.Record, serializer="json"):
        ts_ms: int
        node_id: str
        pool_id: str
        queue_depth: int
        running_requests: int
        kv_cache_used_frac: float
        cost_rate_usd_per_h: float
        interval_ms: int

    class Outcome(faust.Record, serializer="json"):
        ts_ms: int
        pool_id: str
        outcome: str
        attempt: int
        prompt_tokens: int
        output_tokens: int

    app = faust.App(
        f"fleetloop-bench-faust-{uuid.uuid4().hex[:8]}",
        broker=f"kafka://{bootstrap}",
        store="memory://",
        web_enabled=False,
        consumer_auto_offset_reset="earliest",
        topic_disable_leader=True,
        producer_acks=1,
        # Short sessions, as the daemon uses: the embedded broker completes a join in about half of it.
        broker_session_timeout=6.0,
        broker_heartbeat_interval=1.0,
    )
    pools_tel: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
    pools_req: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0, 0.0])
    seen = [0]
    span: dict[str, float] = {}

    def count() -> None:
        if seen[0] == 0:
            span["wall0"], span["cpu0"] = clock.monotonic_s(), clock.cpu_s()
        seen[0] += 1
        if seen[0] >= total:
            wall, cpu = clock.monotonic_s() - span["wall0"], clock.cpu_s() - span["cpu0"]
            out: dict[str, Any] = {"events": seen[0], "wall_s": wall, "cpu_s": cpu, "pools": len(pools_tel)}
            with open(result_path, "wb") as f:
                f.write(orjson.dumps(out))
            os._exit(0)  # the measurement is done; the parent owns the broker and the topics

    @app.agent(app.topic(tel_topic, value_type=Telemetry))
    async def telemetry(stream: Any) -> None:
        async for t in stream:
            agg = pools_tel[t.pool_id]
            agg[0] += 1
            agg[1] += t.queue_depth
            agg[2] += t.kv_cache_used_frac
            agg[3] += t.cost_rate_usd_per_h * t.interval_ms / 3_600_000.0
            count()

    @app.agent(app.topic(req_topic, value_type=Outcome))
    async def outcomes(stream: Any) -> None:
        async for o in stream:
            agg = pools_req[o.pool_id]
            agg[0] += 1
            agg[1] += o.outcome == "ok"
            agg[2] += o.outcome in ("error", "timeout", "retry")
            agg[3] += o.attempt > 0
            agg[4] += o.prompt_tokens + o.output_tokens
            count()

    worker = faust.Worker(app, loglevel="ERROR", quiet=True)
    worker.execute_from_commandline()  # does not return: exits when the worker stops


if __name__ == "__main__":
    main(sys.argv[1:])
