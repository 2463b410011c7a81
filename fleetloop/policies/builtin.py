"""Imports every built-in algorithm module so that each registers itself. Adding an algorithm is one
file plus one line here plus its decision-table test."""

from fleetloop.policies.admission import max_pending, queue_depth
from fleetloop.policies.autoscale import fixed, hpa
from fleetloop.policies.batching import static
from fleetloop.policies.breaker import consecutive_errors, envoy_outlier, never
from fleetloop.policies.retry_budget import ratio, unlimited
from fleetloop.policies.routing import least_queue, least_request, round_robin

__all__ = [
    "consecutive_errors",
    "envoy_outlier",
    "fixed",
    "hpa",
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
