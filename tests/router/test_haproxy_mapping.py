"""The state -> HAProxy mapping, row by row (fleetloop/edges/actuate/haproxy/mapping.py), and log parsing."""

from __future__ import annotations

from pathlib import Path

import pytest
from fleetloop.edges.actuate.haproxy.actuator import BackendMapError, load_backend_map
from fleetloop.edges.actuate.haproxy.logs import (
    HAPROXY_FRONTEND_SNIPPET,
    HAPROXY_STREAMING_DEFAULTS,
    LOG_FORMAT,
    LogParser,
)
from fleetloop.edges.actuate.haproxy.mapping import (
    UNMAPPED,
    BackendMap,
    Observed,
    PoolMap,
    Slot,
    Target,
    parse_servers_state,
    parse_stat_maxconn,
    plan,
    scale_weight,
    targets,
)
from fleetloop.edges.actuate.haproxy.runtime_api import parse_address
from fleetloop.edges.headers import HEADERS, call_headers, task_end
from fleetloop.router.state import DesiredState
from fleetloop.schemas.decisions import AdmissionDecision, AutoscaleDecision
from hypothesis import given
from hypothesis import strategies as st
from tests.router.test_pick import admission, breaker, env, routing

ROOT = Path(__file__).resolve().parents[2]
SLOTS = tuple(Slot(f"p/{i}", "p", "be", f"s{i}") for i in range(4))
BMAP = BackendMap((PoolMap("p", "be", "m", SLOTS),))


def _targets(*decisions: object, now: float = 1.0) -> dict[str, Target]:
    st = DesiredState()
    for d in decisions:
        st.accept(d, 0.0)  # type: ignore[arg-type]
    return {s.server: t for s, t in targets(st, BMAP, now, 30.0).items()}


def test_weights_scale_to_haproxy_range_relative_to_the_heaviest() -> None:
    t = _targets(routing("p", {"p/0": 0.5, "p/1": 0.25, "p/2": 0.0, "p/3": 0.001}))
    assert [(t[s].admin, t[s].weight) for s in ("s0", "s1", "s2", "s3")] == [
        ("ready", 256),
        ("ready", 128),
        ("ready", 0),
        ("ready", 1),  # a tiny share keeps HAProxy's smallest weight, not zero
    ]
    assert scale_weight(1e-9, 1.0) == 1
    assert scale_weight(0.0, 1.0) == 0


@given(st.lists(st.floats(min_value=0.0, max_value=1.7e308), min_size=1, max_size=50))
def test_any_weights_the_schema_accepts_scale_into_haproxys_range(weights: list[float]) -> None:
    max_w = max(weights)
    got = [scale_weight(w, max_w) for w in weights]
    assert all(0 <= g <= 256 for g in got)
    assert all((g == 0) == (w <= 0) for g, w in zip(got, weights, strict=True))
    assert got[weights.index(max_w)] == (256 if max_w > 0 else 0)


def test_open_breaker_is_maint_half_open_is_ready_at_its_probe_weight() -> None:
    t = _targets(
        routing("p", {"p/0": 0.0, "p/1": 0.9, "p/2": 0.1, "p/3": 0.0}),
        breaker("p/0", "open"),
        breaker("p/2", "half_open"),
        breaker("p/3", "open", enforced=False),
    )
    assert (t["s0"].admin, t["s0"].why) == ("maint", "breaker-open")
    assert (t["s2"].admin, t["s2"].weight, t["s2"].why) == ("ready", 28, "half-open")
    assert t["s3"].admin == "ready"  # detected, not enforced: not ejected


def test_slot_without_a_member_is_disabled_and_autoscale_drain_drains() -> None:
    scale = AutoscaleDecision(
        entity="pool/p", reason="r", pool_id="p", current_nodes=3, desired_nodes=2, drain=("p/1",)
    )
    t = _targets(routing("p", {"p/0": 0.4, "p/1": 0.3, "p/2": 0.3}), env(scale))
    assert (t["s3"].admin, t["s3"].why) == ("maint", "not-a-member")
    assert (t["s1"].admin, t["s1"].why) == ("drain", "autoscale-drain")


def test_every_slot_ejected_ignores_the_breakers() -> None:
    t = _targets(routing("p", {"p/0": 1.0}), breaker("p/0"))
    assert (t["s0"].admin, t["s0"].weight, t["s0"].why) == ("ready", 100, "never-empty")
    assert {t[s].admin for s in ("s1", "s2", "s3")} == {"maint"}  # not members: no node behind them


@pytest.mark.parametrize(
    ("decisions", "ready"),
    [
        # a decision naming no node (a daemon that lost sight of the pool): every slot, as when stale
        pytest.param([routing("p", {})], {"s0", "s1", "s2", "s3"}, id="no-member"),
        pytest.param([routing("p", {"p/9": 1.0})], {"s0", "s1", "s2", "s3"}, id="members-unknown-here"),
        pytest.param([routing("p", {}), breaker("p/2")], {"s0", "s1", "s3"}, id="no-member-one-ejected"),
        # members, none with a weight above 0, or all drained: the members, at the plain weight
        pytest.param([routing("p", {"p/0": 0.0, "p/1": 0.0})], {"s0", "s1"}, id="weights-zero"),
        pytest.param(
            [routing("p", {"p/0": 0.0, "p/1": 1.0}), breaker("p/1")], {"s0"}, id="the-weighted-one-ejected"
        ),
        pytest.param(
            [
                routing("p", {"p/0": 1.0, "p/1": 1.0}),
                env(
                    AutoscaleDecision(
                        entity="pool/p",
                        reason="r",
                        pool_id="p",
                        current_nodes=2,
                        desired_nodes=0,
                        drain=("p/0", "p/1"),
                    )
                ),
            ],
            {"s0", "s1"},
            id="every-member-drained",
        ),
    ],
)
def test_a_fresh_decision_that_leaves_no_slot_never_empties_the_backend(
    decisions: list[object], ready: set[str]
) -> None:
    t = _targets(*decisions)
    assert {s for s, x in t.items() if x.admin == "ready" and x.weight > 0} == ready
    assert {t[s].why for s in ready} == {"never-empty"}
    assert {t[s].weight for s in ready} == {100}


def test_maxconn_only_when_every_class_is_limited() -> None:
    limited = _targets(routing("p", {"p/0": 1.0}), admission("p", max_outstanding={"0": 64, "2": 16}))
    assert limited["s0"].maxconn == 64
    partial = _targets(routing("p", {"p/0": 1.0}), admission("p", max_outstanding={"2": 16}))
    assert partial["s0"].maxconn == 0
    assert isinstance(AdmissionDecision, type)


def test_stale_state_is_plain_load_balancing() -> None:
    t = _targets(routing("p", {"p/0": 1.0}), breaker("p/1"), now=31.0)
    assert {(x.admin, x.weight) for x in t.values()} == {("ready", 100)}


def test_plan_orders_weight_before_leaving_maint_and_reports_missing() -> None:
    want = {SLOTS[0]: Target("ready", 50, 0, "routing"), SLOTS[1]: Target("maint", 0, 0, "breaker-open")}
    seen = {("be", "s0"): Observed("maint", 100, 0)}
    changes, missing = plan(want, seen)
    assert [c.command for c in changes] == ["set server be/s0 weight 50", "set server be/s0 state ready"]
    assert missing == [SLOTS[1]]


SERVERS_STATE = """1
# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state srv_uweight srv_iweight srv_time_since_last_change srv_check_status srv_check_result srv_check_health srv_check_state srv_agent_state bk_f_forced_id srv_f_forced_id srv_fqdn srv_port srvrecord srv_use_ssl srv_check_port srv_check_addr srv_agent_addr srv_agent_port
3 be 1 s0 127.0.0.1 2 0 50 100 3 1 0 2 0 0 0 0 - 18090 - 0 0 - - 0
3 be 2 s1 127.0.0.1 0 1 100 100 1 1 0 0 0 0 0 0 - 18091 - 0 0 - - 0
3 be 3 s2 127.0.0.1 2 8 100 100 1 1 0 0 0 0 0 0 - 18091 - 0 0 - - 0
"""  # noqa: E501  (captured from HAProxy 2.6.12)


def test_parse_servers_state_reads_admin_bits_and_user_weight() -> None:
    got = parse_servers_state(SERVERS_STATE)
    assert got[("be", "s0")] == Observed("ready", 50, None)
    assert got[("be", "s1")].admin == "maint"
    assert got[("be", "s2")].admin == "drain"


def test_parse_stat_maxconn() -> None:
    text = "# pxname,svname,qcur,slim\nbe,s0,0,7\nbe,s1,0,\nbe,BACKEND,0,10\n"
    assert parse_stat_maxconn(text) == {("be", "s0"): 7, ("be", "s1"): 0}


LINE = (
    '<134>Nov 30 13:48:15 haproxy[1]: fleetloop1 "r-1" "2" "wf-9" "3" "gold" "0" "4000" "pfx1" "900" '
    '"7F00" be s1 200 41 97 ---- 1796046492 112'
)


@pytest.mark.parametrize(
    ("server", "status", "tsc", "outcome", "node"),
    [
        ("s1", "200", "----", "ok", "p/1"),
        ("s1", "502", "SH--", "error", "p/1"),
        ("s1", "504", "sH--", "timeout", "p/1"),
        ("<NOSRV>", "503", "SC--", "shed", None),
        ("s1", "503", "sQ--", "shed", None),
        ("s1", "429", "----", "shed", None),  # turned away for load: the rule of fleetloop.edges.answers
        ("s1", "200", "CD--", "error", "p/1"),  # cut short by the client after the answer began
    ],
)
def test_log_line_to_outcome(server: str, status: str, tsc: str, outcome: str, node: str | None) -> None:
    parser = LogParser(BMAP.by_server())
    line = LINE.replace(" s1 200 ", f" {server} {status} ").replace(" ---- ", f" {tsc} ")
    o = parser.parse(line)
    assert o is not None
    assert (o.outcome, o.node_id) == (outcome, node)
    assert (o.request_id, o.attempt, o.workflow_id, o.step_index) == ("r-1", 2, "wf-9", 3)
    assert (o.tenant_id, o.priority, o.latency_budget_ms, o.prefix_digest) == ("gold", 0, 4000, "pfx1")
    assert o.prompt_tokens == 900
    assert o.ts_ms == 1796046492112 + 97
    assert o.ttft_ms == (41.0 if outcome == "ok" else None)


def test_log_lines_without_headers_and_bad_ones() -> None:
    parser = LogParser(BMAP.by_server(), default_priority=2)
    o = parser.parse(
        LINE.replace('"r-1" "2" "wf-9" "3" "gold" "0" "4000" "pfx1" "900"', '"" "" "" "" "" "" "" "" ""')
    )
    assert o is not None
    assert (o.request_id, o.workflow_id, o.tenant_id, o.priority) == ("7F00", "7F00", "anonymous", 2)
    assert o.task_outcome == "succeeded"  # a call that names no task is a task of its own, ended by it
    assert parser.parse("haproxy[1]: Proxy fe started.") is None
    assert parser.stats.ignored == 1
    assert parser.parse(LINE.replace('"gold"', '"bad tenant!"')) is None
    assert parser.parse(LINE.replace(" be s1", " other s1")) is None
    assert parser.stats.malformed == 2


def test_backend_map_errors_are_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "m.yaml"
    for text, msg in [
        ("pools: {}", "non-empty 'pools'"),
        ("pools: {p: {backend: be, servers: {p/0: s0}}}", "pools.p.model"),
        ("pools: {p: {backend: be, model: m, servers: {p/0: 'a b'}}}", "plain server name"),
        ("pools: {p: {backend: be, model: m, servers: {p/0: s0, p/1: s0}}}", "mapped twice"),
        (": [", "--backend-map"),
    ]:
        bad.write_text(text)
        with pytest.raises(BackendMapError, match=msg.replace("(", r"\(")) as exc:
            load_backend_map(bad)
        assert "\n" not in str(exc.value)
    bad.write_text("pools: {p: {backend: be, model: m, servers: {p/0: s0}}}")
    assert load_backend_map(bad).pools[0].slots == (Slot("p/0", "p", "be", "s0"),)


@pytest.mark.parametrize(
    ("addr", "ok"),
    [("unix:/run/h.sock", True), ("/run/h.sock", True), ("127.0.0.1:9999", True), ("10.0.0.1:9999", False)],
)
def test_runtime_api_address(addr: str, ok: bool) -> None:
    if ok:
        parse_address(addr)
    else:
        with pytest.raises(ValueError, match="loopback"):
            parse_address(addr)


def test_readme_lists_every_unmapped_field_and_the_exact_frontend_snippet() -> None:
    readme = (ROOT / "docs" / "integrations" / "routers.md").read_text()
    for name, why in UNMAPPED.items():
        assert f"| `{name}` | {why} |" in readme, name
    assert HAPROXY_FRONTEND_SNIPPET in readme
    # the streamed-token option sits in the README's defaults block (indented as the block is)
    assert f"   defaults\n       mode http\n       log global\n   {HAPROXY_STREAMING_DEFAULTS}\n" in readme


@pytest.mark.parametrize(
    ("final", "status", "tsc", "task_outcome"),
    [
        ("1", "200", "----", "succeeded"),  # the task's last call, answered: the task ends
        ("true", "200", "----", "succeeded"),
        ("1", "502", "SH--", None),  # failed: the caller may retry it, only it knows when it gives up
        ("-", "200", "----", None),  # not said: a router cannot tell the last call
        ("0", "200", "----", None),
    ],
)
def test_a_final_call_that_succeeds_ends_its_task(
    final: str, status: str, tsc: str, task_outcome: str | None
) -> None:
    parser = LogParser(BMAP.by_server())
    line = LINE.replace("fleetloop1 ", "fleetloop2 ").replace('"900" ', f'"900" "{final}" ')
    line = line.replace(" s1 200 ", f" s1 {status} ").replace(" ---- ", f" {tsc} ")
    o = parser.parse(line)
    assert o is not None, parser.stats.last_error
    assert o.task_outcome == task_outcome
    assert (o.workflow_id, o.step_index, o.prompt_tokens) == ("wf-9", 3, 900)
    # the layout written before the final header is still read, and says nothing of the task's end
    legacy = parser.parse(LINE)
    assert legacy is not None
    assert legacy.task_outcome is None
    # one layout's fields under the other's word is malformed, not misread
    assert parser.parse(LINE.replace("fleetloop1 ", "fleetloop2 ")) is None
    assert parser.parse(line.replace("fleetloop2 ", "fleetloop1 ")) is None


def test_the_log_format_names_every_header_in_order() -> None:
    assert LOG_FORMAT.startswith("fleetloop2 ")
    assert LOG_FORMAT.count("[var(txn.fl_") == len(HEADERS)
    assert LOG_FORMAT.index("txn.fl_prompt_tokens") < LOG_FORMAT.index("txn.fl_final")


@pytest.mark.parametrize(
    ("values", "final"),
    [
        ({}, True),  # names no task: a task of its own, its own last call
        ({"final": "0"}, False),  # the caller says not last
        ({"task": "wf-1"}, False),  # a named task: only the caller knows its last call
        ({"task": "wf-1", "final": "1"}, True),
        ({"task": "wf-1", "final": "true"}, True),
        ({"task": "wf-1", "final": "yes"}, False),
    ],
)
def test_a_call_that_names_no_task_is_its_own_last_call(values: dict[str, str], final: bool) -> None:
    c = call_headers(values, request_id="r-7", default_priority=1)
    assert c.final is final
    assert c.workflow_id == values.get("task", "r-7")
    assert task_end(c, "ok") == ("succeeded" if final else None)
    assert task_end(c, "error") is None
