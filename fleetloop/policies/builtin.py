"""The built-in algorithms: the one table the policy compiler reads (:mod:`fleetloop.policies.registry`).

Each class names itself (``name``, ``section``); nothing registers itself by being imported. Adding an
algorithm is one file plus one line here plus its decision-table test.
"""

from __future__ import annotations

from typing import Any, Final

from fleetloop.policies.admission.max_pending import MaxPending
from fleetloop.policies.admission.queue_depth import QueueDepth
from fleetloop.policies.admission.slo_aware import SloAware
from fleetloop.policies.autoscale.capacity import Capacity
from fleetloop.policies.autoscale.fixed import Fixed
from fleetloop.policies.autoscale.hpa import Hpa
from fleetloop.policies.autoscale.keda_engine import KedaEngine
from fleetloop.policies.autoscale.keda_epp import KedaEpp
from fleetloop.policies.autoscale.predictive import SloPredictive
from fleetloop.policies.batching.static import StaticBatching
from fleetloop.policies.batching.tbt_feedback import TbtFeedback
from fleetloop.policies.breaker.consecutive_errors import ConsecutiveErrors
from fleetloop.policies.breaker.envoy_outlier import EnvoyOutlier
from fleetloop.policies.breaker.latency_outlier import LatencyOutlier
from fleetloop.policies.breaker.never import Never
from fleetloop.policies.retry_budget.ratio import Ratio
from fleetloop.policies.retry_budget.unlimited import Unlimited
from fleetloop.policies.routing.cache_aware import CacheAware
from fleetloop.policies.routing.least_queue import LeastQueue
from fleetloop.policies.routing.least_request import LeastRequest
from fleetloop.policies.routing.llm_d import LlmDEpp
from fleetloop.policies.routing.round_robin import RoundRobin

# Each one meets fleetloop.policies.base.Algorithm (tests/policies/test_contract.py holds them to it).
ALGORITHMS: Final[tuple[type[Any], ...]] = (
    # admission
    MaxPending,
    QueueDepth,
    SloAware,
    # autoscale
    Capacity,
    Fixed,
    Hpa,
    KedaEngine,
    KedaEpp,
    SloPredictive,
    # batching
    StaticBatching,
    TbtFeedback,
    # breaker
    ConsecutiveErrors,
    EnvoyOutlier,
    LatencyOutlier,
    Never,
    # retry_budget
    Ratio,
    Unlimited,
    # routing
    CacheAware,
    LeastQueue,
    LeastRequest,
    LlmDEpp,
    RoundRobin,
)
