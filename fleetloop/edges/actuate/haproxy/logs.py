"""HAProxy's own log -> RequestOutcome: what each call did, as HAProxy saw it, for fleet.requests.

HAProxy logs one line per request to a syslog target; the actuator listens on a loopback UDP port
(``--log-listen 127.0.0.1:PORT``) and HAProxy points ``log 127.0.0.1:PORT len 4096 local0`` at it.
The frontend copies fleetloop's request headers into variables and logs them with ``LOG_FORMAT``
(``HAPROXY_FRONTEND_SNIPPET`` is the exact text to paste; docs/integrations/routers.md shows it,
with ``HAPROXY_STREAMING_DEFAULTS`` for the ``defaults`` section), read by the table every
integration shares (:mod:`fleetloop.edges.headers`): a missing request id is HAProxy's unique id
(``%ID``), a missing priority ``--default-priority`` (1).

From HAProxy itself: backend and server (-> pool and node through the backend map), status code,
termination state, ``%Tr`` (time to the server's response headers: the time to first token of a
streamed completion, an upper bound for a non-streamed one) and ``%Ta`` (end to end), accept time.
Outcome (the rule every integration shares, :func:`fleetloop.edges.answers.answer_outcome`):
``ok`` for 2xx/3xx; ``shed`` when HAProxy had no server or the request timed out in its queue
(``<NOSRV>``, or termination ``sQ``/``SQ``), or the answer was 429; ``timeout`` for a server-side or
client-side timeout (termination ``s*``/``c*``); ``error`` otherwise. Output tokens and cost are not
visible to a proxy: they are 0 here. Cost comes from the nodes' telemetry (their cost rate). Behind
HAProxy the policies read the pool's prompt tokens from fleetloop's headers, when the caller sends
them, and its output tokens from the nodes' own counts, which the model reads when a window's ok
calls carry none (``docs/decisions/slo-predictive.md``, "Shipped: token rates from the nodes when
outcomes carry none").

A line that does not parse, or does not make a valid RequestOutcome (a header value the schema
refuses), is counted and dropped with its reason kept; it never stops the receiver.
"""

from __future__ import annotations

import asyncio
import re
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from fleetloop.edges.actuate.haproxy.mapping import PoolMap, Slot
from fleetloop.edges.answers import answer_outcome
from fleetloop.edges.headers import HEADERS, call_headers
from fleetloop.schemas.requests import Outcome, RequestOutcome

_VARS = [h.replace("-", "_") for h in HEADERS]
# The log line's layout, by its first word: ``fleetloop2`` carries every header of
# :data:`~fleetloop.edges.headers.HEADERS`; ``fleetloop1``, what configurations written before
# ``x-fleetloop-final`` log, carries all but that one (still read, so an upgrade of fleetloop before
# HAProxy's configuration loses no call).
LAYOUTS = {"fleetloop2 ": HEADERS, "fleetloop1 ": HEADERS[: HEADERS.index("final")]}
_LAYOUT_WORD = re.compile("|".join(re.escape(word) for word in LAYOUTS))
LOG_FORMAT = (
    "fleetloop2 "
    + " ".join(f"%{{+Q}}[var(txn.fl_{v})]" for v in _VARS)
    + " %{+Q}ID %b %s %ST %Tr %Ta %tsc %Ts %ms"
)
# In ``defaults`` (or every frontend and backend that carries streamed completions): by default
# HAProxy sends a chunk it forwards with MSG_MORE, and the kernel may hold a lone SSE token up to
# ~200 ms waiting for more. Measured on one emulated node, the first token of a streamed call
# arrived 180-200 ms later through HAProxy than direct without it, 0-2 ms later with it.
HAPROXY_STREAMING_DEFAULTS = "    option http-no-delay"
HAPROXY_FRONTEND_SNIPPET = "\n".join(
    [
        f"    http-request set-var(txn.fl_{v}) req.hdr(x-fleetloop-{h})"
        for v, h in zip(_VARS, HEADERS, strict=True)
    ]
    + ['    unique-id-format "%{+X}o%ci%cp%rt"', f'    log-format "{LOG_FORMAT}"']
)


@dataclass(slots=True)
class LogStats:
    lines: int = 0
    outcomes: int = 0
    malformed: int = 0
    ignored: int = 0  # not a fleetloop log line (HAProxy's own notices)
    last_error: str = ""


def _int(v: str, default: int) -> int:
    try:
        return int(v)
    except ValueError:
        return default


class LogParser:
    def __init__(self, by_server: Mapping[tuple[str, str], tuple[Slot, PoolMap]], default_priority: int = 1):
        self.by_server = by_server
        self.by_backend = {p.backend: p for _, p in by_server.values()}
        self.default_priority = default_priority
        self.stats = LogStats()

    def parse(self, line: str) -> RequestOutcome | None:
        self.stats.lines += 1
        m = _LAYOUT_WORD.search(line)  # the first layout word in the line, in one pass
        if m is None:
            self.stats.ignored += 1
            return None
        i, names = m.start(), LAYOUTS[m.group()]
        try:
            f = shlex.split(line[i:])
            if len(f) != 1 + len(names) + 9:
                raise ValueError(f"{len(f)} fields")
            h = {k: ("" if v == "-" else v) for k, v in zip(names, f[1 : 1 + len(names)], strict=True)}
            uid, backend, server, status, tr, ta, tsc, ts_s, ms = f[1 + len(names) :]
            pool = self.by_backend.get(backend)
            if pool is None:
                raise ValueError(f"backend {backend!r} is not in the backend map")
            slot = self.by_server.get((backend, server))
            st = _int(status, 0)
            placed = server != "<NOSRV>" and tsc[:2] not in ("sQ", "SQ") and slot is not None
            outcome: Outcome = answer_outcome(st, placed=placed)
            if outcome != "shed" and not (outcome == "ok" and tsc[:1] == "-"):  # cut short, or refused
                outcome = "timeout" if tsc[:1] in ("s", "c") else "error"
            c = call_headers(h, request_id=uid, default_priority=self.default_priority)
            tr_ms, ta_ms = _int(tr, -1), _int(ta, 0)
            ro = RequestOutcome(
                ts_ms=_int(ts_s, 0) * 1000 + _int(ms, 0) + max(0, ta_ms),
                pool_id=pool.pool_id,
                node_id=None if outcome == "shed" or slot is None else slot[0].node_id,
                model=pool.model,
                ttft_ms=float(tr_ms) if outcome == "ok" and tr_ms >= 0 else None,
                e2e_ms=float(max(0, ta_ms)),
                outcome=outcome,
                **c.outcome_fields(outcome),
            )
        except (ValueError, ValidationError) as exc:
            self.stats.malformed += 1
            self.stats.last_error = str(exc).splitlines()[0][:300]
            return None
        self.stats.outcomes += 1
        return ro


class _Syslog(asyncio.DatagramProtocol):
    def __init__(self, on_line: Callable[[str], None]) -> None:
        self.on_line = on_line

    def datagram_received(self, data: bytes, addr: Any) -> None:
        for line in data.decode(errors="replace").splitlines():
            if line:
                self.on_line(line)


async def listen_udp(host: str, port: int, on_line: Callable[[str], None]) -> asyncio.DatagramTransport:
    """Receive syslog datagrams on ``host:port`` (loopback); ``transport.close()`` to stop."""
    loop = asyncio.get_running_loop()
    transport, _ = await loop.create_datagram_endpoint(lambda: _Syslog(on_line), local_addr=(host, port))
    return transport
