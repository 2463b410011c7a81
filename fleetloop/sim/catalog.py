"""The simulator's draw of a cold start: the one random part of the node catalog. The catalog
itself (GPUs, models, node specs, cold-start phase medians, each number with its source) is
:mod:`fleetloop.perf.catalog`, shared with the capacity policy."""

from __future__ import annotations

import math

import numpy as np

from fleetloop.perf.catalog import COLD_START_SIGMA, NodeSpec


def sample_cold_start(spec: NodeSpec, rng: np.random.Generator, *, cached: bool) -> tuple[float, float]:
    """One cold start: (seconds until weights start loading, seconds until warm). Each phase is
    lognormal around its median (``COLD_START_SIGMA``); one draw per phase, in a fixed order."""
    med = spec.cold_start_medians(cached=cached)
    drawn = {
        p: (m * math.exp(COLD_START_SIGMA * float(rng.standard_normal())) if m > 0 else 0.0)
        for p, m in med.items()
    }
    to_loading = drawn["init"] + drawn["download"]
    return to_loading, to_loading + drawn["load"] + drawn["compile"] + drawn["capture"]
