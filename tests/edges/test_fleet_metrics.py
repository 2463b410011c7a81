"""An emulated node's ``/metrics`` text is the bytes prometheus_client's ``generate_latest`` writes
from the node's collector, whatever the counts, the values' sizes and the model's name.

``VllmMetrics.exposition`` renders the text itself (``generate_latest`` was too slow for 24 nodes on
one event loop); these tests hold it to ``generate_latest`` over ``VllmMetrics.collect``.
"""

from __future__ import annotations

import math

from fleetloop.edges.fleet.metrics import FINISH_REASONS, VllmMetrics
from fleetloop.perf.catalog import node_spec
from fleetloop.sim.node import IntervalStats, Node, Req
from hypothesis import example, given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest
from tests.sim.physics import Loop

# Values where Python's and Go's formatting part: Go's exponent from seven integer digits on,
# Python's from seventeen; the specials; the smallest and largest floats.
SPECIAL = (
    0.0, -0.0, 1.0, 0.1, 999999.0, 999999.5, 1e6, 1234567.0, 1234567.125, 1e15, 1e16, 1e21, 1.5e300,
    5e-324, 1e-7, -1234567.0, math.inf, -math.inf, math.nan,
)  # fmt: skip

values = st.one_of(
    st.sampled_from(SPECIAL),
    st.integers(min_value=0, max_value=10**22).map(float),
    st.floats(),
)
counts = st.one_of(st.integers(min_value=0, max_value=10**9), values)
observations = st.lists(
    st.tuples(
        st.one_of(st.floats(min_value=0.0, max_value=1e4), st.sampled_from([0.0, 1e-3, 2560.0, math.inf])),
        st.one_of(st.just(1.0), st.floats(min_value=0.0, max_value=1e6), st.integers(1, 10**7).map(float)),
    ),
    max_size=30,
)


def _node() -> Node:
    return Loop(node_spec("llama-8b", "L40S")).node


@settings(max_examples=150, deadline=None)
@given(
    model=st.text(max_size=12),
    start_s=st.one_of(st.floats(min_value=0.0, max_value=4e9), st.sampled_from(SPECIAL)),
    running=st.integers(min_value=0, max_value=3),
    waiting=st.integers(min_value=0, max_value=3),
    kv=st.tuples(st.integers(min_value=0, max_value=10**7), st.integers(min_value=0, max_value=10**7)),
    counters=st.lists(counts, min_size=5, max_size=5),
    success=st.lists(counts, min_size=len(FINISH_REASONS), max_size=len(FINISH_REASONS)),
    ttft=observations,
    itl=observations,
    e2e=observations,
)
@example(
    model='m"\\\n%s{}',
    start_s=1_760_000_000.123,
    running=2,
    waiting=1,
    kv=(3, 7),
    counters=[1e21, 1234567.0, math.inf, 0.5, 0],
    success=[0, 7, math.nan, -math.inf, 1e16],
    ttft=[(0.0, 1.0), (1e-3, 2.5), (3000.0, 1.0), (math.inf, 1.0)],
    itl=[(0.021, 7.0), (0.0335, 3.0)],
    e2e=[(3.2, 1.0)],
)
def test_the_text_is_what_generate_latest_writes(
    model: str,
    start_s: float,
    running: int,
    waiting: int,
    kv: tuple[int, int],
    counters: list[float],
    success: list[float],
    ttft: list[tuple[float, float]],
    itl: list[tuple[float, float]],
    e2e: list[tuple[float, float]],
) -> None:
    node = _node()
    node.prefilling.extend(Req(i, 1, 1, None, 0) for i in range(running))
    node.waiting.extend(Req(10 + i, 1, 1, None, 0) for i in range(waiting))
    node.kv_used, node.capacity = kv
    m = VllmMetrics(node, model, start_s=start_s)
    (m.prefix_queries, m.prefix_hits, m.preemptions, m.prompt_tokens, m.generation_tokens) = counters
    m.success.update(zip(FINISH_REASONS, success, strict=True))
    for h, obs in ((m.ttft, ttft), (m.itl, itl), (m.e2e, e2e)):
        for value_s, weight in obs:
            h.observe(value_s, weight)
    assert m.exposition() == generate_latest(m.registry)


def test_a_node_folded_over_time_writes_what_generate_latest_writes() -> None:
    m = VllmMetrics(_node(), "llama-8b", start_s=1_760_000_000.5)
    for i in range(200):
        m.fold(
            IntervalStats(
                ttft_ms=[5.0 + 37.0 * i, 0.4],
                tbt=[(21.0 + i % 13, 7.0), (33.5, 3.0)],
                completed=i % 3,
                timeouts=int(i % 7 == 0),
                errors=int(i % 11 == 0),
                prompt_tokens=12345,
                output_tokens=6789,
                prefix_lookups=4,
                prefix_hits=i % 4,
                preemptions=int(i % 5 == 0),
            )
        )
        m.observe_e2e(0.25 * i)
        assert m.exposition() == generate_latest(m.registry)
    text = m.exposition().decode()
    assert 'vllm:prompt_tokens_total{engine="0",model_name="llama-8b"} 2.469e+06\n' in text
    assert "process_start_time_seconds 1.7600000005e+09\n" in text
