"""The policy and shadow follower: which policy decides each tick, and the documents that change it.

Policy documents arrive on ``control.policy``; a valid one with the followed name and a higher
version replaces the active policy between batches (:meth:`PolicyFollower.apply_pending`); an
invalid one is refused (logged and dead-lettered) and the active one stays in force. A new policy
decides every tick from the next boundary after any tick already decided, and a tick is decided
under the policy active at its time (:meth:`PolicyFollower.policy_at`), also when decided again
after a restore, so a restart across a policy change stays exact.

A document with ``spec.mode: shadow`` (key ``<name>/shadow``) does not replace the enforcing
policy: it runs beside it from the next tick boundary, on the same ticks and the same folded
records, with its own policy state per pool (:meth:`Shard.decide_shadow`), and its decisions go to
``control.shadow``. A tombstone on ``<name>/shadow`` removes it.

The policy in force, its history and the shadow in force are the group's record on
``control.policy.active`` (:meth:`PolicyFollower.active_record`), with the ``control.policy``
offset considered up to: a restart resumes them (:meth:`PolicyFollower.load_active`) and reads on
after that offset.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import orjson

from fleetloop.core.decide.engine import Engine
from fleetloop.core.shard import Shadow
from fleetloop.daemon.observability import logger
from fleetloop.daemon.observe.decode import EMPTY_VALUE, DeadLetter, dead_letter_of, reason_of
from fleetloop.daemon.runtime.config import DaemonConfig
from fleetloop.daemon.runtime.deadletters import DeadLetters
from fleetloop.daemon.runtime.link import Link
from fleetloop.daemon.runtime.partition import Partitions
from fleetloop.daemon.runtime.port import Clock, Record
from fleetloop.daemon.runtime.telemetry import DaemonStats
from fleetloop.policies.registry import CompiledPolicy, PolicyError, compile_policy, parse_document
from fleetloop.schemas.control import Activation, ActivePolicy, ShadowActivation
from fleetloop.schemas.topics import POLICY_ACTIVE, topic_name

log = logger("fleetloop.daemon")
KEPT_ACTIVATIONS = 8  # activations (and shadow activations) the record keeps, the newest


def active_of(records: Sequence[Record], group: str) -> ActivePolicy | None:
    """The newest ActivePolicy for ``group`` among the records of control.policy.active."""
    latest: bytes | None = None
    key = group.encode()
    for r in records:
        if r.key == key and r.value:
            latest = r.value
    if latest is None:
        return None
    try:
        return ActivePolicy.model_validate_json(latest)
    except ValueError:
        log.warning("control.policy.active holds an unreadable record for this group; ignored")
        return None


class PolicyFollower:
    def __init__(
        self,
        config: DaemonConfig,
        clock: Clock,
        parts: Partitions,
        link: Link,
        *,
        engine: Engine,
        dead_letters: DeadLetters,
        stats: DaemonStats,
    ) -> None:
        self.config = config
        self.clock = clock
        self.parts = parts  # the ticks decided so far: a new policy decides from after them
        self.link = link
        self.dead_letters = dead_letters  # publishes and counts refusals by reason, like the door's
        self.engine = engine  # holds the policy in force
        self.stats = stats
        self.topic = topic_name(config.prefix, POLICY_ACTIVE)
        # Policies by the event time from which they decide, oldest first (the last one is active).
        self.activations: list[tuple[int, CompiledPolicy]] = [(0, config.policy)]
        # The shadow policy by the event time from which it decides (None: removed), oldest first.
        self.shadows: list[tuple[int, Shadow | None]] = []
        # Accepted, to take effect between batches: a policy, a shadow (a 1-tuple: None inside removes).
        self.pending_policy: CompiledPolicy | None = None
        self.pending_shadow: tuple[Shadow | None] | None = None
        self.pending_offset = -1
        self.considered = -1  # control.policy offset considered up to

    # -- which policy decides ----------------------------------------------------------------------

    def policy_at(self, ts_ms: int) -> CompiledPolicy:
        for from_ts, policy in reversed(self.activations):
            if from_ts <= ts_ms:
                return policy
        return self.activations[0][1]

    def shadow_at(self, ts_ms: int) -> Shadow | None:
        for from_ts, shadow in reversed(self.shadows):
            if from_ts <= ts_ms:
                return shadow
        return None

    def shadow_now(self) -> Shadow | None:
        return self.shadows[-1][1] if self.shadows else None

    def active_record(self) -> ActivePolicy:
        from_ts, policy = self.activations[-1]
        return ActivePolicy(
            group=self.config.group_id,
            name=policy.stamp.name,
            version=policy.stamp.version,
            hash=policy.stamp.hash,
            from_ts_ms=from_ts,
            from_tick_id=from_ts // policy.tick_ms,
            considered_offset=self.considered,
            refused=self.stats.policies_refused,
            last_refusal=self.stats.last_refusal[:500],
            history=[Activation(from_ts_ms=t, document=p.document) for t, p in self.activations],
            shadow=[
                ShadowActivation(from_ts_ms=t, document=s.policy.document if s is not None else None)
                for t, s in self.shadows
            ],
        )

    # -- start, follow, activate -------------------------------------------------------------------

    async def load_active(self) -> None:
        """Resume the policy this group had activated; the initial policy only starts a new group
        (or is activated like any newer version, when it is one)."""
        records = await self.link.broker.read_log(self.topic, client="active")
        record = active_of(records, self.config.group_id)
        initial = self.config.policy
        if record is None:
            await self._publish_active()
            return
        restored: list[tuple[int, CompiledPolicy]] = []
        for a in record.history:
            try:
                restored.append((a.from_ts_ms, compile_policy(a.document)))
            except PolicyError as exc:
                log.warning("an activated policy no longer compiles; skipped", error=str(exc)[:300])
        self.considered = record.considered_offset
        for sa in record.shadow:
            try:
                doc = sa.document
                self.shadows.append((sa.from_ts_ms, Shadow.of(compile_policy(doc)) if doc else None))
            except PolicyError as exc:
                log.warning("a shadow policy no longer compiles; skipped", error=str(exc)[:300])
        if (shadow := self.shadow_now()) is not None:
            log.info(
                "shadow policy resumed",
                name=shadow.stamp.name,
                version=shadow.stamp.version,
                hash=shadow.stamp.hash,
                from_tick=self.shadows[-1][0] // self.engine.policy.tick_ms,
            )
        self.stats.policies_refused = record.refused
        self.stats.last_refusal = record.last_refusal
        if restored:
            self.activations = restored
            self.engine.set_policy(restored[-1][1])
            log.info(
                "policy resumed",
                name=record.name,
                version=record.version,
                hash=record.hash,
                from_tick=record.from_tick_id,
            )
        active = self.engine.policy.stamp
        if initial.stamp.name == active.name and initial.stamp.version > active.version:
            await self.activate(initial, self.considered)

    async def follow(self, stop: asyncio.Event) -> None:
        """Read control.policy until ``stop``: accept, refuse (dead-lettered) or ignore each record."""
        follow = self.config.follow_policy or self.config.policy.stamp.name
        reader = self.link.policies
        while not stop.is_set():
            records = await reader.poll(timeout_ms=500)
            if not records:
                continue
            refused = [letter for r in records if (letter := self.consider(r, follow)) is not None]
            if refused and self.link.session is not None:
                await self.dead_letters.publish(refused, stage="policy")
            if self.pending_policy is None and self.pending_shadow is None:
                # Everything up to here is decided (refused or ignored): a restart starts after it.
                self.considered = max(self.considered, records[-1].offset)
                await self._publish_active()
            else:
                self.pending_offset = max(self.pending_offset, records[-1].offset)

    async def apply_pending(self) -> None:
        """Activate what was accepted since the last batch (the loop calls this between batches)."""
        if self.pending_policy is not None:
            await self.activate(self.pending_policy, self.pending_offset)
            self.pending_policy = None
        if self.pending_shadow is not None:
            await self.activate_shadow(self.pending_shadow[0], self.pending_offset)
            self.pending_shadow = None

    def _next_boundary(self, tick_ms: int) -> int:
        """The first tick boundary after now and after every tick already decided."""
        decided = max((ts for o in self.parts for _, ts in o.shard.last_tick.values()), default=0)
        start = max(self.clock.wall_ms(), decided + 1)
        return -(-start // tick_ms) * tick_ms

    async def activate(self, policy: CompiledPolicy, offset: int) -> None:
        """Make ``policy`` decide every tick from the next boundary after any decided one."""
        tick_ms = policy.tick_ms
        from_ts = self._next_boundary(tick_ms)
        self.activations = [*self.activations[1 - KEPT_ACTIVATIONS :], (from_ts, policy)]
        self.engine.set_policy(policy)
        self.considered = max(self.considered, offset)
        self.stats.policies_applied += 1
        log.info(
            "policy activated",
            name=policy.stamp.name,
            version=policy.stamp.version,
            hash=policy.stamp.hash,
            from_tick=from_ts // tick_ms,
        )
        await self._publish_active()

    async def activate_shadow(self, shadow: Shadow | None, offset: int) -> None:
        """Run ``shadow`` beside the enforcing policy (None: stop) from the next tick boundary."""
        tick_ms = self.engine.policy.tick_ms
        from_ts = self._next_boundary(tick_ms)
        self.shadows = [*self.shadows[1 - KEPT_ACTIVATIONS :], (from_ts, shadow)]
        self.considered = max(self.considered, offset)
        if shadow is None:
            log.info("shadow policy removed", from_tick=from_ts // tick_ms)
        else:
            log.info(
                "shadow policy activated",
                name=shadow.stamp.name,
                version=shadow.stamp.version,
                hash=shadow.stamp.hash,
                from_tick=from_ts // tick_ms,
            )
        await self._publish_active()

    async def _publish_active(self) -> None:
        if self.link.session is None:
            return
        producer = self.link.producer
        value = orjson.dumps(self.active_record().model_dump(mode="json"), option=orjson.OPT_SORT_KEYS)
        key = self.config.group_id.encode()
        await self.link.retrying(
            "policy-active", lambda: producer.send_and_wait(self.topic, value=value, key=key)
        )

    # -- one record of control.policy --------------------------------------------------------------

    def _refuse(self, record: Record, reason: str) -> DeadLetter:
        self.stats.policies_refused += 1
        self.stats.last_refusal = reason
        log.error("policy refused; the active policy stays in force", reason=reason)
        return dead_letter_of(record, reason)

    def consider(self, record: Record, follow: str) -> DeadLetter | None:
        """Take a valid newer policy for the next batch; a dead letter (an event, counted once) for
        an invalid one, an older version, or the active version with other content. A shadow
        document (``spec.mode: shadow``) is held to the same rules against the shadow in force."""
        if not record.value and record.key is not None and bytes(record.key).endswith(b"/shadow"):
            if record.key != f"{follow}/shadow".encode():
                return None  # another group's shadow removal, on a shared topic
            current = self.pending_shadow[0] if self.pending_shadow is not None else self.shadow_now()
            if current is not None:
                self.pending_shadow = (None,)
                self.pending_offset = record.offset
                log.info("shadow policy removal accepted", name=follow)
            return None
        # Each refusal's reason starts with its kind (what the dead-letter counters group by).
        if not record.value:
            return self._refuse(record, EMPTY_VALUE)
        limit = self.config.door.max_record_bytes
        if len(record.value) > limit:
            return self._refuse(record, f"record-too-large: {len(record.value)} bytes > {limit}")
        try:
            data = orjson.loads(record.value)
        except orjson.JSONDecodeError as exc:
            return self._refuse(record, f"json_invalid: not a JSON policy document: {exc}")
        try:
            compiled = compile_policy(parse_document(data, f"{record.topic}@{record.offset}"))
        except Exception as exc:  # whatever the record holds, the active policy stays in force
            why = str(exc) if isinstance(exc, PolicyError) else reason_of(exc)
            return self._refuse(record, f"policy-invalid: {why}")
        active = self.pending_policy or self.engine.policy
        if compiled.stamp.name != follow:
            return None  # another daemon group's policy on a shared topic
        if compiled.document.spec.mode == "shadow":
            return self._consider_shadow(record, compiled, active)
        if compiled.stamp.hash == active.stamp.hash:
            return None  # the active document itself (re-read, or re-published)
        step = self.config.max_policy_version_step
        if compiled.stamp.version > active.stamp.version + step:
            # A forged version 10**15 would lock the operator out of every later real version.
            return self._refuse(
                record,
                f"policy-version-jump: version {compiled.stamp.version} is more than {step} above the "
                f"active version {active.stamp.version}",
            )
        if compiled.stamp.version <= active.stamp.version:
            return self._refuse(
                record,
                f"policy-not-newer: {compiled.stamp.name} v{compiled.stamp.version} is not newer than "
                f"the active v{active.stamp.version} (hash {active.stamp.hash})",
            )
        self.pending_policy = compiled
        self.pending_offset = record.offset
        log.info(
            "policy accepted",
            name=compiled.stamp.name,
            version=compiled.stamp.version,
            hash=compiled.stamp.hash,
        )
        return None

    def _consider_shadow(
        self, record: Record, compiled: CompiledPolicy, active: CompiledPolicy
    ) -> DeadLetter | None:
        current = self.pending_shadow[0] if self.pending_shadow is not None else self.shadow_now()
        if current is not None and compiled.stamp.hash == current.stamp.hash:
            return None  # the shadow in force itself
        base = current.stamp.version if current is not None else active.stamp.version
        step = self.config.max_policy_version_step
        if compiled.stamp.version > base + step:
            return self._refuse(
                record,
                f"policy-version-jump: shadow version {compiled.stamp.version} is more than {step} "
                f"above version {base}",
            )
        if current is not None and compiled.stamp.version <= current.stamp.version:
            return self._refuse(
                record,
                f"policy-not-newer: shadow {compiled.stamp.name} v{compiled.stamp.version} is not newer "
                f"than the shadow in force v{current.stamp.version} (hash {current.stamp.hash})",
            )
        try:
            shadow = Shadow.of(compiled)
        except PolicyError as exc:
            return self._refuse(record, f"policy-invalid: {exc}")
        self.pending_shadow = (shadow,)
        self.pending_offset = record.offset
        log.info(
            "shadow policy accepted",
            name=compiled.stamp.name,
            version=compiled.stamp.version,
            hash=compiled.stamp.hash,
        )
        return None
