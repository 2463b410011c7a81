"""Control records. Tick: the event that makes fleetloop decide; ticks travel on ``control.ticks``
so a replay sees exactly the ticks the live run saw (docs/decisions/ticks-as-events.md).
ActivePolicy: the policy a daemon group activated (and the shadow policy it runs beside it), on
``control.policy.active``."""

from __future__ import annotations

from pydantic import Field

from fleetloop.schemas.base import MAX_TICK_ID, EpochMs, Ident, NonNegInt, Wire
from fleetloop.schemas.policy import PolicyDocument


class Tick(Wire):
    """Decide for ``pool_id`` as of event time ``ts_ms``. ``tick_id`` increases by one per tick."""

    ts_ms: EpochMs
    tick_id: int = Field(ge=0, le=MAX_TICK_ID)
    pool_id: Ident


class Activation(Wire):
    """One policy document in force from event time ``from_ts_ms`` (ticks at or after it)."""

    from_ts_ms: EpochMs
    document: PolicyDocument


class ShadowActivation(Wire):
    """A shadow document run beside the enforcing one from event time ``from_ts_ms`` (ticks at or
    after it), its decisions on ``control.shadow``; ``document`` None: no shadow from then on."""

    from_ts_ms: EpochMs
    document: PolicyDocument | None = None


class ActivePolicy(Wire):
    """What a consumer group's daemon runs, on the compacted ``control.policy.active`` (key: group).

    Written when a document is activated and when one is refused, so a restart resumes the
    activated document (not whatever ``control.policy`` holds last for the name) and does not
    consider (and dead-letter) the same refused records again."""

    group: str = Field(min_length=1, max_length=255)
    name: str
    version: int = Field(ge=1, le=MAX_TICK_ID)
    hash: str
    from_ts_ms: EpochMs
    from_tick_id: int = Field(ge=0, le=MAX_TICK_ID)
    considered_offset: int = Field(ge=-1, le=2**63 - 1)  # control.policy offset considered up to (inclusive)
    refused: NonNegInt = 0  # documents refused so far
    last_refusal: str = ""
    history: list[Activation] = Field(default_factory=list, max_length=16)  # oldest first, incl. active
    # The shadow policy's changes, oldest first; the last is in force (its document None: removed).
    shadow: list[ShadowActivation] = Field(default_factory=list, max_length=16)

    @property
    def shadow_document(self) -> PolicyDocument | None:
        """The shadow document in force, if any."""
        return self.shadow[-1].document if self.shadow else None
