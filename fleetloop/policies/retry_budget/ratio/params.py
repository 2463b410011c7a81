"""ratio's parameters: the ``Params`` model, its defaults and bounds (why each default is what it is:
README.md beside this file, "Parameters")."""

from __future__ import annotations

from pydantic import Field

from fleetloop.policies.base import Params


class RatioParams(Params):
    retry_ratio: float = Field(default=0.2, ge=0.0, le=1.0)
    min_retries_per_s: float = Field(default=10.0, ge=0.0, le=10_000.0)
    per_tenant: bool = True
    exempt_shed_and_lost: bool = True
    episode_max_s: float = Field(default=300.0, ge=0.0, le=3600.0)
