"""``decision_from_newer``: a router or actuator older than its daemon keeps following control.state.

A record of this version is read exactly as the strict model reads it; one that differs only by
names this version does not know (a field anywhere in the envelope, the stamp or the body, or a
whole kind) is read without them; everything else stays an error, unknown names or not."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from fleetloop.schemas.decisions import (
    BreakerDecision,
    Decision,
    PolicyStamp,
    RoutingDecision,
    decision_from_newer,
)
from pydantic import ValidationError

STAMP = PolicyStamp(name="t", version=1, hash="0" * 16, mode="enforce")
ROUTING = Decision(
    ts_ms=1_700_000_000_000,
    tick_id=7,
    policy=STAMP,
    body=RoutingDecision(entity="pool/p", reason="r", pool_id="p", weights={"p/0": 0.25, "p/1": 0.75}),
)


def _json(d: Decision) -> dict[str, Any]:
    out: dict[str, Any] = orjson.loads(d.model_dump_json())
    return out


def test_a_record_of_this_version_is_the_strict_read() -> None:
    raw = ROUTING.model_dump_json()
    dropped: list[str] = []
    assert decision_from_newer(raw, dropped) == Decision.model_validate_json(raw)
    assert dropped == []


def test_fields_a_newer_daemon_added_are_left_out_and_named() -> None:
    j = _json(ROUTING)
    j["region"] = "eu"
    j["policy"]["signed_by"] = "ops"
    j["body"]["weights_by_region"] = {"eu": {"p/0": 1.0}}
    raw = orjson.dumps(j)
    with pytest.raises(ValidationError):
        Decision.model_validate_json(raw)  # what a router read before: malformed, so fail static
    dropped: list[str] = []
    assert decision_from_newer(raw, dropped) == ROUTING
    assert sorted(dropped) == ["body.weights_by_region", "policy.signed_by", "region"]


def test_a_kind_a_newer_daemon_added_is_skipped() -> None:
    j = _json(ROUTING)
    j["body"] = {"kind": "placement", "entity": "pool/p", "reason": "r", "anything": [1, 2]}
    dropped: list[str] = []
    assert decision_from_newer(orjson.dumps(j), dropped) is None
    assert dropped == ["kind placement"]


@pytest.mark.parametrize(
    "spoil",
    [
        lambda j: j["body"]["weights"].update({"p/0": 1e308}),  # a known field past its bound
        lambda j: j.update(tick_id=-1),
        lambda j: j["body"].pop("pool_id"),  # a known field missing
        lambda j: j["policy"].update(hash="not hex"),
        lambda j: j["body"].update(kind=3),  # a kind that is not a name
        lambda j: j["body"].pop("kind"),
    ],
    ids=["bound", "tick", "missing", "stamp", "kind-type", "no-kind"],
)
def test_a_newer_name_does_not_excuse_anything_else(spoil: Any) -> None:
    """One unknown name beside a real fault: still malformed, with the strict read's error."""
    j = _json(ROUTING)
    j["body"]["from_the_future"] = True
    spoil(j)
    with pytest.raises(ValidationError):
        decision_from_newer(orjson.dumps(j))


@pytest.mark.parametrize(
    "raw",
    [b"", b"not json", b"[1, 2]", b"{}", b"[" * 100_000 + b"]" * 100_000, b'{"body": {"kind": "routing"}}'],
    ids=["empty", "text", "array", "object", "deep", "partial"],
)
def test_what_is_not_a_decision_stays_an_error(raw: bytes) -> None:
    with pytest.raises(ValidationError):
        decision_from_newer(raw)


def test_every_kind_is_known_to_the_reader() -> None:
    """A kind added to DecisionBody but not to the reader's table would be skipped as "newer"."""
    body = BreakerDecision(entity="n", reason="r", pool_id="p", node_id="n", state="open")
    breaker = Decision(ts_ms=1, tick_id=1, policy=STAMP, body=body)
    j = _json(breaker)
    j["body"]["extra"] = 1
    assert decision_from_newer(orjson.dumps(j)) == breaker
    from fleetloop.schemas.decisions import _BODIES, DecisionKind

    assert set(_BODIES) == set(DecisionKind.__args__)
