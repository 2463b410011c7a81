"""The LiteLLM callback: fleetloop's pick as a LiteLLM deployment filter, and every attempt's outcome to
``fleet.requests``. The I/O shell around :mod:`fleetloop.edges.litellm.core`.

LiteLLM runs a ``CustomLogger``'s async hooks in the event loop that serves the call (the proxy's,
or the SDK caller's); the Kafka clients start in that loop on the first hook, in the background: a
call never waits for the broker. A sync call (``Router.completion``, picked by
:class:`FleetloopStrategy`) runs the sync hooks in its caller's thread or LiteLLM's logging threads:
with no loop there, the clients start in a loop of their own on a daemon thread, and an outcome from
any other thread is handed to the clients' loop (``call_soon_threadsafe``), never waited on. One
lock guards the routing state across those threads.

Until ``control.state`` has been read the router holds no decision and fails static (LiteLLM's
candidates, round robin), as it does whenever the state goes stale; outcomes produced before the
producer is up wait in a bounded buffer. A broker that cannot be reached is retried every
``RETRY_S`` and logged once per distinct error; it never fails a call.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import os
import threading
import uuid
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import openai
from litellm.integrations.custom_logger import CustomLogger
from litellm.types.router import CustomRoutingStrategyBase, RouterRateLimitError

from fleetloop.edges.answers import answer_outcome
from fleetloop.edges.litellm.core import LiteLLMRouting
from fleetloop.edges.litellm.mapping import (
    DeploymentMap,
    DeploymentMapError,
    load_deployment_map,
    request_metadata,
)
from fleetloop.kafka_security import Bootstrap, SecurityError, error_text, from_settings
from fleetloop.router import clock
from fleetloop.router.follow import StateFollower
from fleetloop.router.pick import FAIL_STATIC_S
from fleetloop.router.publish import OutcomePublisher
from fleetloop.schemas.decisions import Decision
from fleetloop.schemas.requests import Outcome, RequestOutcome

log = logging.getLogger("fleetloop.litellm")
RETRY_S = 5.0
BUFFER = 10_000  # outcomes kept while the producer is not up yet (the oldest go first)
CLOSE_S = 10.0  # what :meth:`FleetloopCallback.close` waits for the flush


class ConfigError(ValueError):
    """A setting the callback cannot start with (one line)."""


def _seconds(a: Any, b: Any) -> float | None:
    """``b - a`` in seconds for two datetimes (or epoch seconds), None when either is missing."""
    if a is None or b is None:
        return None
    if isinstance(a, dt.datetime) and isinstance(b, dt.datetime):
        return (b - a).total_seconds()
    if isinstance(a, int | float) and isinstance(b, int | float):
        return float(b) - float(a)
    return None


def _call_ids(kw: Mapping[str, Any]) -> tuple[str, str]:
    """(LiteLLM's call id, its trace id) of a request or a logging event ("" for one it lacks)."""
    return str(kw.get("litellm_call_id") or ""), str(kw.get("litellm_trace_id") or "")


def _yes(v: str | None, *, default: bool) -> bool:
    if v is None:
        return default
    return v.lower() in ("1", "true", "yes")


def _int(v: Any) -> int:
    return v if isinstance(v, int) and v >= 0 else 0


def failure_outcome(exception: Any) -> Outcome:
    """A failed attempt's outcome. A timeout is the caller's own clock; an answer with an HTTP
    status (LiteLLM's exceptions carry the deployment's as ``status_code``) goes by the rule every
    integration shares (:func:`fleetloop.edges.answers.answer_outcome`: a 429 is a shed, no node's
    error); anything else (refused, reset, a stream broken off) is an error of the node tried."""
    if isinstance(exception, openai.APITimeoutError | TimeoutError):
        return "timeout"
    status = getattr(exception, "status_code", None)
    if type(status) is not int:
        return "error"
    answer = answer_outcome(status)
    return "error" if answer == "ok" else answer  # a failed attempt, whatever status it names


def _is_async(kwargs: Mapping[str, Any]) -> bool:
    """Whether a logging event is an async call's (``acompletion``, the proxy's): those are reported
    by the async hooks, so the sync ones leave them alone and none is counted twice."""
    params = kwargs.get("litellm_params") or {}
    return bool(kwargs.get("acompletion") or (isinstance(params, Mapping) and params.get("acompletion")))


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class _LockedSink:
    """The routing state as the state follower's sink, its changes under the callback's lock (the
    follower runs in the Kafka clients' loop; a sync call picks in its caller's thread)."""

    def __init__(self, routing: LiteLLMRouting, lock: threading.Lock) -> None:
        self._routing = routing
        self._lock = lock

    @property
    def fail_static_s(self) -> float:
        return self._routing.fail_static_s

    @fail_static_s.setter
    def fail_static_s(self, value: float) -> None:
        self._routing.fail_static_s = value

    def apply(self, decisions: Sequence[Decision], now_s: float, refresh_s: float = 0.0) -> list[Decision]:
        with self._lock:
            return self._routing.apply(decisions, now_s, refresh_s)

    def fleet_changed(self) -> None:
        with self._lock:
            self._routing.fleet_changed()


class FleetloopCallback(CustomLogger):
    """Add to ``litellm.callbacks`` (SDK) or name in the proxy's ``litellm_settings.callbacks``
    (``fleetloop.edges.litellm.proxy.handler``). ``bootstrap_servers`` None: no Kafka at all (state
    only through :meth:`routing`'s ``apply``, outcomes to ``publish``)."""

    def __init__(
        self,
        bootstrap_servers: Bootstrap | None,
        *,
        topic_prefix: str = "",
        dmap: DeploymentMap | None = None,
        fail_static_s: float = FAIL_STATIC_S,
        default_priority: int = 1,
        follow_telemetry: bool = True,
        rng: np.random.Generator | None = None,
        publish: Callable[[RequestOutcome], None] | None = None,
    ) -> None:
        super().__init__()
        self.routing = LiteLLMRouting(
            dmap, rng=rng, fail_static_s=fail_static_s, default_priority=default_priority
        )
        self.bootstrap = bootstrap_servers
        self.topic_prefix = topic_prefix
        self.follow_telemetry = follow_telemetry
        self.follower: StateFollower | None = None
        self.publisher: OutcomePublisher | None = None
        self._publish_to = publish
        self._buffer: deque[RequestOutcome] = deque(maxlen=BUFFER)
        self._task: asyncio.Task[None] | None = None
        self._last_error = ""
        # The routing state is read and changed from the serving loop, from LiteLLM's sync callers'
        # threads and its logging threads: one lock, held only while it is read or changed.
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None  # where the Kafka clients run
        self._thread: threading.Thread | None = None  # that loop's thread, when no caller had a loop

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> FleetloopCallback:
        """Settings from ``FLEETLOOP_*`` variables (the names fleetloop's commands read their flags
        from): ``FLEETLOOP_BOOTSTRAP_SERVERS`` (required), ``FLEETLOOP_TOPIC_PREFIX``, the TLS/SASL
        ones (``FLEETLOOP_SECURITY_PROTOCOL``, ``FLEETLOOP_SSL_CAFILE``, ..., ``FLEETLOOP_SASL_PASSWORD``),
        ``FLEETLOOP_FAIL_STATIC_S`` (30), ``FLEETLOOP_DEFAULT_PRIORITY`` (1), ``FLEETLOOP_LITELLM_MAP``
        (a deployment map file) and ``FLEETLOOP_LITELLM_TELEMETRY`` (1: follow ``fleet.telemetry``
        for node load; 0: do not)."""
        env = os.environ if environ is None else environ
        prog = "fleetloop's LiteLLM callback"

        def get(name: str) -> str | None:
            return env.get(f"FLEETLOOP_{name}") or None

        bootstrap = get("BOOTSTRAP_SERVERS")
        if bootstrap is None:
            raise ConfigError(f"{prog}: set FLEETLOOP_BOOTSTRAP_SERVERS (HOST:PORT of the Kafka brokers)")
        try:
            conn = from_settings(
                bootstrap,
                security_protocol=get("SECURITY_PROTOCOL") or "PLAINTEXT",
                ssl_cafile=get("SSL_CAFILE"),
                ssl_certfile=get("SSL_CERTFILE"),
                ssl_keyfile=get("SSL_KEYFILE"),
                ssl_check_hostname=(get("SSL_NO_CHECK_HOSTNAME") or "false").lower()
                not in ("1", "true", "yes"),
                sasl_mechanism=get("SASL_MECHANISM"),
                sasl_username=get("SASL_USERNAME"),
                sasl_password=get("SASL_PASSWORD"),
                sasl_password_file=get("SASL_PASSWORD_FILE"),
            )
        except SecurityError as exc:
            raise ConfigError(f"{prog}: {exc}") from None
        try:
            fail_static_s = float(get("FAIL_STATIC_S") or FAIL_STATIC_S)
        except ValueError:
            raise ConfigError(
                f"{prog}: FLEETLOOP_FAIL_STATIC_S {get('FAIL_STATIC_S')!r}: not a number"
            ) from None
        try:
            priority = int(get("DEFAULT_PRIORITY") or 1)
        except ValueError:
            raise ConfigError(
                f"{prog}: FLEETLOOP_DEFAULT_PRIORITY {get('DEFAULT_PRIORITY')!r}: not a number"
            ) from None
        if not 0 < fail_static_s <= 3600:
            raise ConfigError(f"{prog}: FLEETLOOP_FAIL_STATIC_S must be in (0, 3600]")
        if not 0 <= priority <= 9:
            raise ConfigError(f"{prog}: FLEETLOOP_DEFAULT_PRIORITY must be in 0..9")
        path = get("LITELLM_MAP")
        try:
            dmap = load_deployment_map(path) if path else None
        except DeploymentMapError as exc:
            raise ConfigError(f"{prog}: {exc}") from None
        telemetry = _yes(get("LITELLM_TELEMETRY"), default=True)
        return cls(
            conn,
            topic_prefix=get("TOPIC_PREFIX") or "",
            dmap=dmap,
            fail_static_s=fail_static_s,
            default_priority=priority,
            follow_telemetry=telemetry,
        )

    # -- Kafka, in the serving loop -----------------------------------------------------------------

    def _ensure_started(self) -> None:
        """Start the Kafka clients once: in the caller's loop (an async call's hook), or, for a sync
        caller with no loop, in a loop of their own on a daemon thread. Never waits for the broker."""
        if self.bootstrap is None:
            return
        running = _running_loop()
        with self._lock:  # once, whichever thread comes first
            if self._loop is not None:
                return
            if running is not None:
                self._loop = running
                self._task = running.create_task(self._connect(), name="fleetloop-litellm")
                return
            loop = self._loop = asyncio.new_event_loop()
        thread = self._thread = threading.Thread(target=self._serve, args=(loop,), name="fleetloop-litellm")
        thread.daemon = True  # LiteLLM's sync user need not close it: its outcomes are best effort
        thread.start()

    def _serve(self, loop: asyncio.AbstractEventLoop) -> None:
        asyncio.set_event_loop(loop)
        self._task = loop.create_task(self._connect(), name="fleetloop-litellm")
        try:
            loop.run_forever()
        finally:
            loop.close()

    def _failed(self, what: str, exc: BaseException) -> None:
        message = f"{what}: {error_text(exc)}"
        if message != self._last_error:
            log.warning("fleetloop: %s (retrying every %.0f s)", message, RETRY_S)
            self._last_error = message

    async def _connect(self) -> None:
        assert self.bootstrap is not None
        while self.publisher is None:
            publisher = OutcomePublisher(self.bootstrap, topic_prefix=self.topic_prefix)
            try:
                await publisher.start()
            except Exception as exc:  # a broker away must never stop LiteLLM
                self._failed("cannot publish to fleet.requests", exc)
                with contextlib.suppress(Exception):
                    await publisher.stop()
                await asyncio.sleep(RETRY_S)
                continue
            self.publisher = publisher
            while self._buffer:
                publisher.publish(self._buffer.popleft())
        while self.follower is None:
            endpoints = self.routing.endpoints if self.follow_telemetry else None
            follower = StateFollower(
                _LockedSink(self.routing, self._lock),
                self.bootstrap,
                topic_prefix=self.topic_prefix,
                endpoints=endpoints,
            )
            try:
                await follower.start()
            except Exception as exc:  # as above; start() closed what it opened
                self._failed("cannot follow control.state", exc)
                await asyncio.sleep(RETRY_S)
                continue
            self.follower = follower
            log.info("fleetloop: following control.state (%d decisions)", follower.stats.accepted)

    async def stop(self) -> None:
        """Stop following and flush the outcomes queued (for an SDK user's shutdown, and tests), in
        the loop the Kafka clients run in (a sync caller's: :meth:`close`)."""
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.follower is not None:
            await self.follower.stop()
            self.follower = None
        if self.publisher is not None:
            await self.publisher.stop()
            self.publisher = None
        if self._thread is None:
            self._loop = None  # the next hook starts the clients again, in its own loop

    def close(self, timeout_s: float = CLOSE_S) -> None:
        """:meth:`stop` for a sync user (``Router.completion`` only, no loop of its own): stops the
        clients' thread after the flush. With the clients in a caller's loop, ``await stop()``."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        with contextlib.suppress(Exception):  # a flush that does not finish in time is given up
            asyncio.run_coroutine_threadsafe(self.stop(), loop).result(timeout_s)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout_s)
        self._loop = self._thread = None

    def _publish(self, o: RequestOutcome | None) -> None:
        """Hand an outcome on without waiting: from a thread other than the clients' loop (a sync
        call, LiteLLM's logging threads) it is queued into that loop, whose producer sends it."""
        if o is None:
            return
        if self._publish_to is not None:
            self._publish_to(o)
            return
        loop = self._loop
        if loop is None or loop is _running_loop():
            self._queue(o)
            return
        try:
            loop.call_soon_threadsafe(self._queue, o)
        except RuntimeError:  # that loop is closed: keep it for a later start
            self._buffer.append(o)

    def _queue(self, o: RequestOutcome) -> None:
        if self.publisher is not None:
            self.publisher.publish(o)
        else:
            self._buffer.append(o)

    # -- LiteLLM's hooks ----------------------------------------------------------------------------

    async def async_filter_deployments(
        self,
        model: str,
        healthy_deployments: list[Any],
        messages: Any,
        request_kwargs: dict[str, Any] | None = None,
        parent_otel_span: Any = None,
    ) -> list[Any]:
        """Keep the deployments on the node fleetloop picks (none: shed)."""
        return self._select(model, healthy_deployments, request_kwargs or {})

    def _select(self, model: str, deployments: Sequence[Any], request: Mapping[str, Any]) -> list[Any]:
        self._ensure_started()
        call_id, trace_id = _call_ids(request)
        with self._lock:
            kept, shed = self.routing.select(
                model,
                deployments,
                request,
                call_id=call_id or trace_id or f"litellm-{uuid.uuid4()}",
                now_s=clock.monotonic_s(),
                wall_ms=clock.wall_ms(),
            )
        self._publish(shed)
        return list(kept)

    async def async_log_success_event(
        self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any
    ) -> None:
        self._success(kwargs, start_time, end_time)

    def log_success_event(self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any) -> None:
        """A sync call's success (LiteLLM runs it in a logging thread of its own)."""
        if not _is_async(kwargs):
            self._success(kwargs, start_time, end_time)

    def _success(self, kwargs: Any, start_time: Any, end_time: Any) -> None:
        self._ensure_started()
        slp = kwargs.get("standard_logging_object") or {}
        params = kwargs.get("litellm_params") or {}
        began = (
            kwargs.get("current_attempt_api_call_start_time")
            or kwargs.get("api_call_start_time")
            or start_time
        )
        first = _seconds(began, kwargs.get("completion_start_time"))
        whole = _seconds(began, end_time)
        with self._lock:
            o = self.routing.outcome(
                _call_ids(kwargs),
                {
                    "model_name": slp.get("model_group"),
                    "model_info": params.get("model_info"),
                    "litellm_params": {"api_base": slp.get("api_base") or params.get("api_base")},
                },
                "ok",
                request=params,
                now_s=clock.monotonic_s(),
                wall_ms=clock.wall_ms(),
                ttft_ms=first * 1000.0 if first is not None and kwargs.get("stream") else None,
                e2e_ms=whole * 1000.0 if whole is not None else None,
                prompt_tokens=_int(slp.get("prompt_tokens")),
                output_tokens=_int(slp.get("completion_tokens")),
            )
        self._publish(o)

    async def async_post_call_failure_deployment_hook(
        self,
        request_data: Mapping[str, Any],
        exception: Exception,
        call_type: Any,
        fallback_depth: int | None = None,
    ) -> None:
        """Each failed attempt on a deployment (LiteLLM's own retries included)."""
        self._failure(request_data, exception, request_data.get("model_info"), request_data.get("api_base"))

    async def async_log_failure_event(
        self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any
    ) -> None:
        """A failure the deployment hook did not report (a stream that broke after its first
        chunk): only for a call fleetloop placed and has no result for yet, so none is counted twice."""
        with self._lock:
            placed = self.routing.placed(_call_ids(kwargs))
        if placed:
            self._logged_failure(kwargs)

    def log_failure_event(self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any) -> None:
        """A sync call's failed attempt: LiteLLM logs each, its own retries included (the async
        calls' are the deployment hook's)."""
        if not _is_async(kwargs):
            self._logged_failure(kwargs)

    def _logged_failure(self, kwargs: Mapping[str, Any]) -> None:
        ids = _call_ids(kwargs)
        params = kwargs.get("litellm_params") or {}
        self._failure(
            {**params, "litellm_call_id": ids[0], "litellm_trace_id": ids[1]},
            kwargs.get("exception"),
            params.get("model_info"),
            params.get("api_base"),
        )

    def _failure(self, request: Mapping[str, Any], exception: Any, model_info: Any, api_base: Any) -> None:
        self._ensure_started()
        kind = failure_outcome(exception)
        with self._lock:
            o = self.routing.outcome(
                _call_ids(request),
                {
                    "model_name": request_metadata(request).get("model_group"),
                    "model_info": model_info,
                    "litellm_params": {"api_base": api_base},
                },
                kind,
                request=request,
                now_s=clock.monotonic_s(),
                wall_ms=clock.wall_ms(),
            )
        self._publish(o)

    # -- the sync calls' pick ---------------------------------------------------------------------

    def strategy(self, router: Any) -> FleetloopStrategy:
        """fleetloop's pick as ``router``'s custom routing strategy, for its sync calls:
        ``router.register_plugin(cb.strategy(router))``."""
        return FleetloopStrategy(self, router)

    def pick(self, router: Any, model: str, request: Mapping[str, Any]) -> Any:
        """The deployment a call goes to: among ``model``'s deployments that LiteLLM does not hold
        in cooldown, the filter's choice (:meth:`async_filter_deployments`; a retry is LiteLLM's
        same call placed again, as there); raises LiteLLM's 429 when the call is shed or every
        deployment cools down."""
        deployments = [d for d in router.registry().deployments(model) or () if isinstance(d, Mapping)]
        ids = [str((d.get("model_info") or {}).get("id") or "") for d in deployments]
        cooling = {str(i) for i, _ in router.health().cooldowns.get_active_cooldowns(ids, None)}
        healthy = [d for d, i in zip(deployments, ids, strict=True) if i not in cooling]
        kept = self._select(model, healthy, request) if healthy else []
        if not kept:
            raise RouterRateLimitError(
                model=model, cooldown_time=0.0, enable_pre_call_checks=False, cooldown_list=sorted(cooling)
            )
        with self._lock:
            k = int(self.routing.rng.integers(len(kept)))
        return kept[k]


class FleetloopStrategy(CustomRoutingStrategyBase):
    """LiteLLM's custom routing strategy that picks as fleetloop's callback does
    (:meth:`FleetloopCallback.pick`): the SDK's sync calls run no deployment filter, only a custom
    strategy. LiteLLM hands its async calls to it too, once registered; each call is picked once."""

    def __init__(self, callback: FleetloopCallback, router: Any) -> None:
        self.callback = callback
        self.router = router

    def get_available_deployment(
        self,
        model: str,
        messages: list[dict[str, str]] | None = None,
        input: str | list[object] | None = None,
        specific_deployment: bool | None = False,
        request_kwargs: dict[str, object] | None = None,
    ) -> Any:
        return self.callback.pick(self.router, model, request_kwargs or {})

    async def async_get_available_deployment(
        self,
        model: str,
        messages: list[dict[str, str]] | None = None,
        input: str | list[object] | None = None,
        specific_deployment: bool | None = False,
        request_kwargs: dict[str, object] | None = None,
    ) -> Any:
        return self.callback.pick(self.router, model, request_kwargs or {})
