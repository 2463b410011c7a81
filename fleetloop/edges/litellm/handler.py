"""The LiteLLM callback: fleetloop's pick as a LiteLLM deployment filter, and every attempt's outcome to
``fleet.requests``. The I/O shell around :mod:`fleetloop.edges.litellm.core`.

LiteLLM runs a ``CustomLogger``'s hooks in the event loop that serves the call (the proxy's, or the
SDK caller's); the Kafka clients start in that loop on the first hook, in the background: a call
never waits for the broker. Until ``control.state`` has been read the router holds no decision and
fails static (LiteLLM's candidates, round robin), as it does whenever the state goes stale; outcomes
produced before the producer is up wait in a bounded buffer. A broker that cannot be reached is
retried every ``RETRY_S`` and logged once per distinct error; it never fails a call.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import os
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import openai
from litellm.integrations.custom_logger import CustomLogger

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
from fleetloop.schemas.requests import Outcome, RequestOutcome

log = logging.getLogger("fleetloop.litellm")
RETRY_S = 5.0
BUFFER = 10_000  # outcomes kept while the producer is not up yet (the oldest go first)


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
        if self._task is None and self.bootstrap is not None:
            self._task = asyncio.get_running_loop().create_task(self._connect(), name="fleetloop-litellm")

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
                self.routing, self.bootstrap, topic_prefix=self.topic_prefix, endpoints=endpoints
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
        """Stop following and flush the outcomes queued (for an SDK user's shutdown, and tests)."""
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

    def _publish(self, o: RequestOutcome | None) -> None:
        if o is None:
            return
        if self._publish_to is not None:
            self._publish_to(o)
        elif self.publisher is not None:
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
        self._ensure_started()
        request = request_kwargs or {}
        call_id, trace_id = _call_ids(request)
        kept, shed = self.routing.select(
            model,
            healthy_deployments,
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
        self._publish(
            self.routing.outcome(
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
        )

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
        ids = _call_ids(kwargs)
        if not self.routing.placed(ids):
            return
        params = kwargs.get("litellm_params") or {}
        self._failure(
            {**params, "litellm_call_id": ids[0], "litellm_trace_id": ids[1]},
            kwargs.get("exception"),
            params.get("model_info"),
            params.get("api_base"),
        )

    def _failure(self, request: Mapping[str, Any], exception: Any, model_info: Any, api_base: Any) -> None:
        self._ensure_started()
        kind: Outcome = "timeout" if isinstance(exception, openai.APITimeoutError | TimeoutError) else "error"
        self._publish(
            self.routing.outcome(
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
        )
