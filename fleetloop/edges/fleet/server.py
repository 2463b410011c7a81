"""One emulated node's HTTP server: what vLLM's OpenAI-compatible server speaks.

- ``POST /v1/chat/completions`` and ``POST /v1/completions``: streaming (server-sent events: a role
  chunk at the first token, content chunks as decode steps complete, at most one a second (vLLM
  sends one a token; fewer chunks keep the emulated clients' parsing cheap), a chunk with
  ``finish_reason``, the usage chunk when ``stream_options.include_usage`` is set, ``[DONE]``) and
  not. The prompt's size is the ``X-Fleetloop-Prompt-Tokens`` header when a client sends it (the
  emulated fleet's agents do, to avoid shipping 100k tokens of text to a node they call directly),
  else 4 characters a token;
  the engine generates ``max_tokens`` (finish reason ``length``). ``X-Fleetloop-Prefix`` and
  ``X-Fleetloop-Prefix-Tokens`` name a shared prompt prefix (the prefix cache's key); without
  them, a prompt made by :func:`prompt_text` names its prefix in its text (through a router that
  forwards no client header).
- A streaming client that disconnects aborts its request (the engine stops spending on it, as vLLM
  does); a non-streaming one cannot be seen leaving, so its request runs on as an orphan.
- ``GET /v1/models``, ``GET /health`` (200 when serving, 503 while loading or draining),
  ``GET /metrics`` (:mod:`fleetloop.edges.fleet.metrics`).
- A node that is not serving (cold, loading, draining) answers 503, as a vLLM behind a load
  balancer would look; a crashed node is not listening at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from dataclasses import dataclass
from typing import Any, Protocol

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from fleetloop import clock
from fleetloop.edges.fleet.metrics import VllmMetrics
from fleetloop.sim.node import Node, Req

LOOPBACK = "127.0.0.1"
POLL_S = 0.25  # how often a waiting streaming handler looks for a disconnected client and new tokens
CHUNK_EVERY_S = 1.0  # content chunks carry at most a second of tokens each (the clients parse fewer)
MAX_TOKENS_DEFAULT = 16  # vLLM's default max_tokens for /v1/completions
MAX_PROMPT_TOKENS = 10_000_000
TOKEN_TEXT = " tok"  # noqa: S105 - the text of one generated token, not a secret
HDR_PROMPT_TOKENS = "X-Fleetloop-Prompt-Tokens"
HDR_PREFIX = "X-Fleetloop-Prefix"
HDR_PREFIX_TOKENS = "X-Fleetloop-Prefix-Tokens"
# A prompt sent as text of its real size (four characters a token) names its shared prefix in the
# text itself, for a router that forwards no client header (SGLang's router): the prefix's digest
# at the start, then the shared part, identical in every call that shares it, then the end mark.
PREFIX_OPEN = "[fleetloop-prefix "
PREFIX_CLOSE = "[/fleetloop-prefix]"
CHARS_PER_TOKEN = 4
_ids = itertools.count(1)

FLEET_KEY = web.AppKey("fleet", object)
NODE_KEY = web.AppKey("node", object)


@dataclass(eq=False, slots=True)
class Pending:
    """A request's link from the engine (the node's listener) back to its HTTP handler."""

    first: asyncio.Future[float]
    done: asyncio.Future[str]  # "finished" | "lost"
    metrics: VllmMetrics


@dataclass(eq=False)
class LiveNode:
    """A node, its HTTP server and its vLLM metrics."""

    node: Node
    model: str
    metrics: VllmMetrics
    port: int = 0
    runner: web.AppRunner | None = None
    inflight: int = 0
    scrapes: int = 0  # GET /metrics served
    state: str = "cold"  # cold | serving | draining | stopped

    @property
    def serving(self) -> bool:
        return self.state == "serving" and self.node.alive and self.node.warm and not self.node.draining

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"


class Engines(Protocol):
    """What a node's server asks of the fleet that runs its engine (``live.LiveFleet``)."""

    def t(self) -> float: ...
    def submit(self, ln: LiveNode, req: Req) -> None: ...
    def abort(self, ln: LiveNode, req: Req) -> None: ...
    def maybe_retire(self, ln: LiveNode) -> None: ...


def build_app(fleet: Engines, ln: LiveNode) -> web.Application:
    app = web.Application(client_max_size=64 * 2**20)
    app[FLEET_KEY] = fleet
    app[NODE_KEY] = ln
    app.router.add_post("/v1/chat/completions", _chat)
    app.router.add_post("/v1/completions", _text)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/health", _health)
    app.router.add_get("/metrics", _metrics)
    return app


def _ctx(request: web.Request) -> tuple[Engines, LiveNode]:
    return request.app[FLEET_KEY], request.app[NODE_KEY]  # type: ignore[return-value]


def _error(status: int, message: str, kind: str) -> web.Response:
    body = {"object": "error", "message": message, "type": kind, "param": None, "code": status}
    return web.json_response(body, status=status)


async def _health(request: web.Request) -> web.Response:
    _, ln = _ctx(request)
    return web.Response(status=200 if ln.serving else 503)


async def _models(request: web.Request) -> web.Response:
    _, ln = _ctx(request)
    created = clock.wall_ms() // 1000
    card = {"id": ln.model, "object": "model", "created": created, "owned_by": "vllm", "root": ln.model}
    return web.json_response({"object": "list", "data": [card]})


async def _metrics(request: web.Request) -> web.Response:
    fleet, ln = _ctx(request)
    ln.scrapes += 1
    ln.metrics.fold(ln.node.take_stats(fleet.t()))
    return web.Response(body=ln.metrics.exposition(), headers={"Content-Type": CONTENT_TYPE_LATEST})


async def _chat(request: web.Request) -> web.StreamResponse:
    return await _complete(request, chat=True)


async def _text(request: web.Request) -> web.StreamResponse:
    return await _complete(request, chat=False)


def _int_header(request: web.Request, name: str) -> int | None:
    raw = request.headers.get(name)
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        return None


async def _complete(request: web.Request, *, chat: bool) -> web.StreamResponse:
    fleet, ln = _ctx(request)
    if not ln.serving:
        return _error(503, f"node {ln.node.node_id} is not serving ({ln.state})", "ServiceUnavailable")
    try:
        body = await request.json()
        if not isinstance(body, dict):
            raise ValueError("body is not an object")
    except (ValueError, UnicodeDecodeError):
        return _error(400, "request body is not a JSON object", "BadRequestError")
    if body.get("model") != ln.model:
        return _error(404, f"The model `{body.get('model')}` does not exist.", "NotFoundError")
    text = _prompt_text(body, chat=chat)
    if text is None:
        return _error(400, "messages (chat) or prompt (completions) is required", "BadRequestError")
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or MAX_TOKENS_DEFAULT
    if not isinstance(max_tokens, int) or max_tokens < 1:
        return _error(400, "max_tokens must be a positive integer", "BadRequestError")
    prompt = _int_header(request, HDR_PROMPT_TOKENS) or max(1, len(text) // CHARS_PER_TOKEN)
    prompt = min(max(1, prompt), MAX_PROMPT_TOKENS)
    digest = request.headers.get(HDR_PREFIX) or None
    shared = _int_header(request, HDR_PREFIX_TOKENS) or 0
    if digest is None:
        digest, shared = prefix_in_text(text)
    prefix_tokens = max(0, min(prompt - 1, shared)) if digest else 0
    loop = asyncio.get_running_loop()
    pending = Pending(loop.create_future(), loop.create_future(), ln.metrics)
    req = Req(next(_ids), prompt, max_tokens, digest, prefix_tokens, owner=pending)
    ln.inflight += 1
    try:
        fleet.submit(ln, req)
        if body.get("stream"):
            opts = body.get("stream_options") or {}
            usage = bool(isinstance(opts, dict) and opts.get("include_usage"))
            return await _stream(request, fleet, ln, req, chat=chat, include_usage=usage)
        return await _whole(fleet, ln, req, chat=chat)
    finally:
        ln.inflight -= 1
        fleet.maybe_retire(ln)


def prompt_text(tokens: int, digest: str | None, shared_tokens: int, tail: str) -> str:
    """A prompt of ``tokens`` tokens as text (four characters a token): with ``digest``, its first
    ``shared_tokens`` tokens are the shared prefix, marked (:func:`prefix_in_text` reads it) and the
    same text in every call that shares it (a router that hashes prompts sees the prefix it would
    see in production); then ``tail`` (what makes the call its own) and filler."""
    want = max(1, tokens) * CHARS_PER_TOKEN
    head = ""
    if digest is not None and shared_tokens > 0:
        opening = f"{PREFIX_OPEN}{digest}] "
        body_len = max(0, shared_tokens * CHARS_PER_TOKEN - len(opening))
        unit = f"{digest} "
        head = opening + (unit * (body_len // len(unit) + 1))[:body_len] + PREFIX_CLOSE
    text = f"{head} {tail} "
    return text + "x" * max(0, want - len(text))


def prefix_in_text(text: str) -> tuple[str | None, int]:
    """(digest, shared tokens) of a prompt :func:`prompt_text` made; (None, 0) for any other."""
    if not text.startswith(PREFIX_OPEN):
        return None, 0
    close = text.find("]", len(PREFIX_OPEN))
    end = text.find(PREFIX_CLOSE)
    if close < 0 or end < 0:
        return None, 0
    return text[len(PREFIX_OPEN) : close] or None, end // CHARS_PER_TOKEN


def _prompt_text(body: dict[str, Any], *, chat: bool) -> str | None:
    if chat:
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            return None
        parts = []
        for m in msgs:
            c = m.get("content") if isinstance(m, dict) else None
            parts.append(c if isinstance(c, str) else json.dumps(c))
        return "\n".join(parts)
    prompt = body.get("prompt")
    if isinstance(prompt, list):
        return " ".join(str(p) for p in prompt)
    return prompt if isinstance(prompt, str) else None


def _usage(req: Req, completion: int) -> dict[str, Any]:
    return {
        "prompt_tokens": req.prompt,
        "completion_tokens": completion,
        "total_tokens": req.prompt + completion,
        "prompt_tokens_details": {"cached_tokens": req.cached},
    }


async def _whole(fleet: Engines, ln: LiveNode, req: Req, *, chat: bool) -> web.Response:
    pending = req.owner
    assert isinstance(pending, Pending)
    # Not cancelled if the client leaves (aiohttp does not cancel handlers): the request runs on.
    status = await pending.done
    if status != "finished":
        return _error(500, "the engine lost the request", "InternalServerError")
    n = req.output
    rid = f"{'chatcmpl' if chat else 'cmpl'}-{req.rid}"
    created = clock.wall_ms() // 1000
    content = TOKEN_TEXT * n
    if chat:
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": content},
            "logprobs": None,
            "finish_reason": "length",
        }
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": content, "logprobs": None, "finish_reason": "length"}
        obj = "text_completion"
    body = {"id": rid, "object": obj, "created": created, "model": ln.model, "choices": [choice]}
    body["usage"] = _usage(req, n)
    return web.json_response(body)


def _gone(request: web.Request) -> bool:
    t = request.transport
    return t is None or t.is_closing()


def _progress(ln: LiveNode, req: Req) -> int:
    """Tokens generated so far (as of the node's last completed iteration)."""
    if req.state == "decode":
        return min(req.output - 1, req.generated + 1 + ln.node.counter - req.join_counter)
    return min(req.output - 1, req.generated) if req.first_token_t is not None else 0


async def _stream(
    request: web.Request, fleet: Engines, ln: LiveNode, req: Req, *, chat: bool, include_usage: bool
) -> web.StreamResponse:
    pending = req.owner
    assert isinstance(pending, Pending)
    rid = f"{'chatcmpl' if chat else 'cmpl'}-{req.rid}"
    created = clock.wall_ms() // 1000
    obj = "chat.completion.chunk" if chat else "text_completion"

    def chunk(text: str | None, finish: str | None = None, *, role: bool = False) -> bytes:
        if chat:
            delta: dict[str, Any] = {}
            if role:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
            choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        body = {"id": rid, "object": obj, "created": created, "model": ln.model, "choices": [choice]}
        return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"

    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    sent = 0
    try:
        while not pending.first.done() and not pending.done.done():
            # FIRST_COMPLETED: the first token goes out when the engine makes it, not at the poll
            await asyncio.wait(
                (pending.first, pending.done), timeout=POLL_S, return_when=asyncio.FIRST_COMPLETED
            )
            if _gone(request):
                fleet.abort(ln, req)
                return resp
        if pending.done.done() and pending.done.result() != "finished":
            err = {"error": {"object": "error", "message": "the engine lost the request", "code": 500}}
            await resp.write(b"data: " + json.dumps(err).encode() + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            return resp
        await resp.write(chunk("", role=True) if chat else chunk(""))
        await resp.write(chunk(TOKEN_TEXT))
        sent = 1
        last_chunk_t = fleet.t()
        while not pending.done.done():
            await asyncio.wait((pending.done,), timeout=POLL_S)
            if _gone(request):
                fleet.abort(ln, req)
                return resp
            now_done = _progress(ln, req)
            if now_done > sent and fleet.t() - last_chunk_t >= CHUNK_EVERY_S:
                await resp.write(chunk(TOKEN_TEXT * (now_done - sent)))
                sent = now_done
                last_chunk_t = fleet.t()
        if pending.done.result() != "finished":
            err = {"error": {"object": "error", "message": "the engine lost the request", "code": 500}}
            await resp.write(b"data: " + json.dumps(err).encode() + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            return resp
        if req.output > sent:
            await resp.write(chunk(TOKEN_TEXT * (req.output - sent)))
        await resp.write(chunk(None, "length") if chat else chunk("", "length"))
        if include_usage:
            usage = {"id": rid, "object": obj, "created": created, "model": ln.model, "choices": []}
            usage["usage"] = _usage(req, req.output)
            await resp.write(b"data: " + json.dumps(usage, separators=(",", ":")).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        with contextlib.suppress(ConnectionError):
            await resp.write_eof()
    except ConnectionError:  # the client went away mid-write: abort, as vLLM does
        fleet.abort(ln, req)
    except asyncio.CancelledError:
        fleet.abort(ln, req)
        raise
    return resp
