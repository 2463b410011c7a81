"""Imports every built-in algorithm module so that each registers itself. Adding an algorithm is one
file plus one line here plus its decision-table test."""

from fleetloop.policies.admission import max_pending, queue_depth, slo_aware  # noqa: F401
from fleetloop.policies.autoscale import fixed, hpa, keda_engine, keda_epp, predictive  # noqa: F401 - registers slo-predictive
from fleetloop.policies.batching import static, tbt_feedback  # noqa: F401
from fleetloop.policies.breaker import consecutive_errors, envoy_outlier, latency_outlier, never  # noqa: F401
from fleetloop.policies.retry_budget import ratio, unlimited
from fleetloop.policies.routing import cache_aware, least_queue, least_request, llm_d, round_robin  # noqa: F401

__all__ = [
    "consecutive_errors",
    "envoy_outlier",
    "fixed",
    "hpa",
    "keda_engine",
    "least_queue",
    "least_request",
    "max_pending",
    "never",
    "queue_depth",
    "ratio",
    "round_robin",
    "static",
    "unlimited",
]
