"""The HPA's two rate limits stated one per direction, as Kubernetes writes them
(``calculateScaleUpLimitWithScalingRules``, ``calculateScaleDownLimitWithBehaviors``): the test
oracle of :mod:`fleetloop.policies.autoscale.hpa.rule`, which states them as one function of the
direction."""

from __future__ import annotations

import math
from collections.abc import Sequence

from fleetloop.policies.autoscale.hpa import ScaleEvent, ScalingRules, replicas_change_per_period
from fleetloop.policies.autoscale.hpa.rule import INT32_MAX, INT32_MIN


def scale_up_limit(
    current: int, up: Sequence[ScaleEvent], down: Sequence[ScaleEvent], rules: ScalingRules, now_ms: int
) -> int:
    if rules.select_policy == "Disabled":
        return current
    pick = min if rules.select_policy == "Min" else max
    result = INT32_MAX if rules.select_policy == "Min" else INT32_MIN
    for p in rules.policies:
        start = (
            current
            - replicas_change_per_period(p.period_s, up, now_ms)
            + replicas_change_per_period(p.period_s, down, now_ms)
        )
        proposed = start + p.value if p.type == "Pods" else math.ceil(start * (1 + p.value / 100))
        result = pick(result, proposed)
    return result


def scale_down_limit(
    current: int, up: Sequence[ScaleEvent], down: Sequence[ScaleEvent], rules: ScalingRules, now_ms: int
) -> int:
    if rules.select_policy == "Disabled":
        return current
    pick = max if rules.select_policy == "Min" else min
    result = INT32_MIN if rules.select_policy == "Min" else INT32_MAX
    for p in rules.policies:
        start = (
            current
            - replicas_change_per_period(p.period_s, up, now_ms)
            + replicas_change_per_period(p.period_s, down, now_ms)
        )
        proposed = start - p.value if p.type == "Pods" else int(start * (1 - p.value / 100))
        result = pick(result, proposed)
    return result
