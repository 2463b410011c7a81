"""A router's answer to a call as the caller's outcome: one rule for every integration that reads one
(HAProxy's request log, the emulated fleet's agents behind a router URL, LiteLLM's failure hooks on
a deployment's answer).

A call the router placed on no node is ``shed``: HAProxy with no server for it (``<NOSRV>``) or whose
queue timed out before one took it (termination ``sQ``), and a router that answers 429 Too Many
Requests, the status routers give a call they turn away for load: LiteLLM's "no deployments
available" (a call fleetloop's callback sheds inside it included), vllm-router's and SGLang's
router's rate limiters. 2xx and 3xx are ``ok``; any other status is an ``error`` of whoever answered
(a 503 included: a router passes on its nodes' 503, so a caller cannot tell one that placed the call
from one that did not). A timeout is the caller's or the router's own clock, theirs to tell.
"""

from __future__ import annotations

from typing import Literal

SHED_STATUS = 429

Answer = Literal["ok", "error", "shed"]


def answer_outcome(status: int, *, placed: bool = True) -> Answer:
    """``status``: the HTTP status the caller got; ``placed``: False when the router is known to have
    placed the call on no node (what its own log says)."""
    if not placed or status == SHED_STATUS:
        return "shed"
    return "ok" if 200 <= status < 400 else "error"
