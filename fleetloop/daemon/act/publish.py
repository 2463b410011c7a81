"""Publishing decisions and dead letters.

Every decision goes to ``control.decisions`` (the audit log replay compares against); enforced
ones also go to ``control.state`` (compacted: the newest desired state per key) when they change what
their key asks for, and on a periodic refresh (:mod:`fleetloop.daemon.act.state_changes`). The decisions of a
shadow policy (a document run beside the enforcing one) go to ``control.shadow`` only: routers never
read it, and replay's log stays the enforcing policy's alone. Values are
canonical JSON (sorted keys), so the same decision is the same bytes in a live run and a replay.
``publish`` (and ``flush`` after ``stage``) returns only when the broker acknowledged every record
(acks=all): the caller commits input offsets after that, never before (at-least-once; a duplicate
decision is harmless).

A dead letter carries the original key and bytes, except when they would not fit: a value larger
than ``MAX_DEAD_LETTER_COPY`` (or a key larger than ``MAX_DEAD_LETTER_KEY``) is cut to that size
and the headers say so, with the original length and its sha256, so no record can make the
dead-letter copy exceed the producer's request limit. A dead letter the broker still refuses is
counted and logged by the caller, never raised: the record it stood for is committed past anyway.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Sequence
from operator import itemgetter
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import orjson
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaConnectionError, KafkaError, KafkaTimeoutError
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.producer.message_accumulator import BatchBuilder
from pydantic import BaseModel

from fleetloop.daemon.act.state_changes import StateChanges
from fleetloop.daemon.observe.decode import DeadLetter, digest
from fleetloop.schemas.decisions import Decision, PolicyStamp, state_headers
from fleetloop.schemas.topics import DEADLETTER, DECISIONS, SHADOW, STATE, topic_name


def _pydantic_bytes(decision: Decision) -> bytes:
    """A decision's bytes on the wire as their rule states them: pydantic's JSON form of it (python
    mode, written by orjson), keys sorted. :func:`decision_bytes` writes these bytes, and takes
    this way for a decision it cannot vouch for."""
    return orjson.dumps(decision.model_dump(mode="json"), option=orjson.OPT_SORT_KEYS)


# How a field's values are checked before orjson writes them. pydantic's JSON form (python mode,
# which leaves a NaN or an infinity a float, as orjson writes it: null) and orjson write every value
# alike, with two exceptions, both conversions by pydantic: a bool or an int in a float field is
# written as a float, a bool in an int field as an int. So only float and int fields are checked.
_ANY = 0  # str, Literal, bool, and tuples or dicts of those: written alike, whatever they hold
_FLOAT = 1  # float: exactly a float
_INT = 2  # int: exactly an int
_FLOATS = 3  # dict[str, float]
_INTS = 4  # dict[str, int]
_FLOATS2 = 5  # dict[str, dict[str, float]]
_DICT_OF = {_ANY: _ANY, _FLOAT: _FLOATS, _INT: _INTS, _FLOATS: _FLOATS2}


def _field_kind(annotation: object) -> int | None:
    """The kind of a field type (None, allowed anywhere, is written null by both forms); None for
    a type this module does not plan (a nested model, a float in a sequence): its body class
    always takes pydantic's form."""
    while get_origin(annotation) is Annotated:
        annotation = get_args(annotation)[0]
    origin = get_origin(annotation)
    if origin in (Union, UnionType):
        members = [a for a in get_args(annotation) if a is not type(None)]
        return _field_kind(members[0]) if len(members) == 1 else None
    if annotation is float:
        return _FLOAT
    if annotation is int:
        return _INT
    if annotation in (str, bool) or origin is Literal:
        return _ANY
    if origin is tuple:
        args = get_args(annotation)
        return _ANY if len(args) == 2 and args[1] is Ellipsis and _field_kind(args[0]) == _ANY else None
    if origin is dict:
        key, value = get_args(annotation)
        inner = _field_kind(value)
        return _DICT_OF.get(inner) if _field_kind(key) == _ANY and inner is not None else None
    return None


_FLOAT_ONLY = frozenset((float,))
_INT_ONLY = frozenset((int,))
# None is written null by both, in any field.
_FLOAT_OR_NONE = frozenset((float, type(None)))
_INT_OR_NONE = frozenset((int, type(None)))


class _Plan:
    """What :func:`_written_alike` checks in one model class's field dict, grouped so that each group
    is one C-level pass: the float fields' values (exactly floats, or None), the int fields'
    (exactly ints, or None), and each dict of floats, of ints and of dicts of floats."""

    __slots__ = ("dicts2", "float_dicts", "floats", "int_dicts", "ints", "width")

    def __init__(self, cls: type[BaseModel], fields: list[tuple[str, int]]) -> None:
        def getter(names: list[str]) -> Callable[[dict[str, Any]], tuple[Any, ...]]:
            if not names:
                return lambda _: ()
            get = itemgetter(*names)
            return get if len(names) > 1 else lambda values: (get(values),)

        floats = [n for n, k in fields if k == _FLOAT]
        ints = [n for n, k in fields if k == _INT]
        self.width = len(cls.model_fields)
        self.floats = getter(floats)
        self.ints = getter(ints)
        self.float_dicts = tuple(n for n, k in fields if k == _FLOATS)
        self.int_dicts = tuple(n for n, k in fields if k == _INTS)
        self.dicts2 = tuple(n for n, k in fields if k == _FLOATS2)


def _plan(cls: type[BaseModel]) -> _Plan | None:
    """The checks of ``cls``'s float and int fields; None when a field's type is one
    :func:`_field_kind` does not plan."""
    fields = []
    for name, field in cls.model_fields.items():
        kind = _field_kind(field.annotation)
        if kind is None:
            return None
        fields.append((name, kind))
    return _Plan(cls, fields)


# Each body class the envelope's union holds, planned once (a new body class is planned or refused
# here, and a test names every class).
_PLANS: dict[type[BaseModel], _Plan] = {
    cls: plan
    for cls in get_args(Decision.model_fields["body"].annotation)
    if (plan := _plan(cls)) is not None
}
_ENVELOPE = ("body", "input_offsets", "policy", "tick_id", "ts_ms")
_ENVELOPE_READY = tuple(sorted(Decision.model_fields)) == _ENVELOPE
_STAMP_PLAN = _plan(PolicyStamp)


def _floats_only(d: Any) -> bool:
    return type(d) is dict and (not d or _FLOAT_ONLY.issuperset(map(type, d.values())))


def _written_alike(values: dict[str, Any], plan: _Plan) -> bool:
    """Every float field holds exactly a float (or None where allowed), every int field exactly an
    int, every dict of them exactly a dict of those: then orjson writes what pydantic's JSON form
    writes."""
    if len(values) != plan.width:  # a field missing, or a key that is not a field
        return False
    if not _FLOAT_OR_NONE.issuperset(map(type, plan.floats(values))):
        return False
    if not _INT_OR_NONE.issuperset(map(type, plan.ints(values))):
        return False
    for name in plan.float_dicts:
        if not _floats_only(values[name]):
            return False
    for name in plan.int_dicts:
        d = values[name]
        if type(d) is not dict or (d and not _INT_ONLY.issuperset(map(type, d.values()))):
            return False
    for name in plan.dicts2:
        d = values[name]
        if type(d) is not dict or not all(map(_floats_only, d.values())):
            return False
    return True


# Stamps already checked (a tick's thousands of decisions share a few), kept alive by the entry so
# that an id is never another stamp's.
_STAMPS_SEEN: dict[int, PolicyStamp] = {}


def _stamp_ok(stamp: PolicyStamp, plan: _Plan) -> bool:
    if not _written_alike(stamp.__dict__, plan):
        return False
    if len(_STAMPS_SEEN) >= 64:
        _STAMPS_SEEN.clear()
    _STAMPS_SEEN[id(stamp)] = stamp
    return True


def decision_bytes(decision: Decision) -> bytes:
    """A decision's bytes on the wire (:func:`_pydantic_bytes`), from the models' own field dicts:
    orjson writes every value a decision holds (str, int, float, bool, None, tuples, dicts) itself
    and sorts keys at every depth as pydantic's form does, so only the two nested models need their
    dict. The two differ only where pydantic converts a value that is not its field's type (a bool
    or an int in a float field, a bool in an int field), so a decision's float and int fields are
    checked against its class's plan first; one that fails the check, a body class not planned, or
    a value orjson refuses (a numpy scalar, an int past 64 bits) takes pydantic's way. Why two
    ways: a whole-fleet tick publishes thousands of decisions, and ``model_dump(mode="json")`` was
    about two thirds of what encoding them cost."""
    body = decision.body
    plan = _PLANS.get(type(body))
    values = body.__dict__
    stamp = decision.policy
    if (
        plan is None
        or _STAMP_PLAN is None
        or not _ENVELOPE_READY
        or type(stamp) is not PolicyStamp
        or type(decision.input_offsets) is not dict
    ):
        return _pydantic_bytes(decision)
    try:
        if not (
            _written_alike(values, plan)
            and (_STAMPS_SEEN.get(id(stamp)) is stamp or _stamp_ok(stamp, _STAMP_PLAN))
            and type(decision.ts_ms) is int
            and type(decision.tick_id) is int
            and _INT_ONLY.issuperset(map(type, decision.input_offsets.values()))
        ):
            return _pydantic_bytes(decision)
        return orjson.dumps(
            {
                "body": values,
                "input_offsets": decision.input_offsets,
                "policy": stamp.__dict__,
                "tick_id": decision.tick_id,
                "ts_ms": decision.ts_ms,
            },
            option=orjson.OPT_SORT_KEYS,
        )
    except (TypeError, ValueError, KeyError):
        return _pydantic_bytes(decision)


def _raise_if_transient(exc: Exception) -> None:
    """A broker that is away is the caller's to wait out (it retries); anything else is counted."""
    if isinstance(exc, (KafkaConnectionError, KafkaTimeoutError)) or (
        isinstance(exc, KafkaError) and exc.retriable
    ):
        raise exc


_PARTITIONER = DefaultPartitioner()
MAX_DEAD_LETTER_COPY = 64 * 1024  # far below any broker's or producer's default 1 MiB limit
MAX_DEAD_LETTER_KEY = 1024


def dead_letter_headers(d: DeadLetter, stage: str) -> list[tuple[str, bytes]]:
    headers = [
        ("fleetloop.error", d.reason.encode()),
        ("fleetloop.source", f"{d.topic}:{d.partition}:{d.offset}".encode()),
        ("fleetloop.stage", stage.encode()),
    ]
    value = d.value or b""
    if len(value) > MAX_DEAD_LETTER_COPY:
        headers.append(("fleetloop.truncated", str(len(value)).encode()))
        headers.append(("fleetloop.sha256", digest(value).encode()))
    if d.key is not None and len(d.key) > MAX_DEAD_LETTER_KEY:
        headers.append(("fleetloop.key_truncated", str(len(d.key)).encode()))
        headers.append(("fleetloop.key_sha256", digest(d.key).encode()))
    return headers


def dead_letter_record(d: DeadLetter, stage: str) -> tuple[bytes | None, bytes, list[tuple[str, bytes]]]:
    """(key, value, headers) of the copy published for ``d``: bounded whatever ``d`` holds."""
    key = d.key[:MAX_DEAD_LETTER_KEY] if d.key is not None else None
    value = (d.value or b"")[:MAX_DEAD_LETTER_COPY]
    return key, value, dead_letter_headers(d, stage)


class Publisher:
    """Decisions go out as each pool is decided (:meth:`stage`), in record batches the client
    sends in the background; :meth:`flush` returns once the broker acknowledged every one. One
    ``send`` call per record cost ~9 us of the loop's time (~2,900 records a tick at 1,000 nodes,
    29,000 at 10,000): appending to a batch costs ~1 us, and the loop never waits on a round trip
    between pools."""

    def __init__(self, producer: AIOKafkaProducer, prefix: str, state_refresh_ms: int = 0) -> None:
        self._producer = producer
        # control.state: each key when it changes, and a refresh (state_changes); 0: every decision.
        self.state_changes = StateChanges(state_refresh_ms)
        self._state_headers = state_headers(state_refresh_ms)
        self._decisions = topic_name(prefix, DECISIONS)
        self._state = topic_name(prefix, STATE)
        self._shadow = topic_name(prefix, SHADOW)
        self._deadletter = topic_name(prefix, DEADLETTER)
        self.decisions_published = 0
        self.state_published = 0
        self.shadow_published = 0
        self.dead_letters = 0
        self.end_offset = 0  # one past the highest dead letter the broker acknowledged to us
        self._partitions: dict[str, list[int]] = {}  # topic -> its partitions, as the client knows them
        self._open: dict[tuple[str, int], BatchBuilder] = {}  # staged records not yet handed over
        self._full: deque[tuple[str, int, BatchBuilder]] = deque()  # full batches, in fill order
        self._sent: list[asyncio.Future[object]] = []  # batches handed to the client, not awaited
        self._pump: asyncio.Task[None] | None = None
        self._failed: BaseException | None = None
        self.batches_sent = 0

    async def publish(self, decisions: Sequence[Decision], shadow: Sequence[Decision] = ()) -> None:
        """Send every decision (and enforced ones to the state topic), and a shadow policy's
        decisions to the shadow topic; wait for all acks."""
        await self.stage(decisions, shadow)
        await self.flush()

    async def stage(self, decisions: Sequence[Decision], shadow: Sequence[Decision] = ()) -> None:
        """Queue these decisions to go out now, without waiting for the broker: the records go
        into the current batch of their topic partition, handed to the client as soon as the one
        before it left (a background task; the caller yields to let it run)."""
        try:
            for d in shadow:
                await self._append(self._shadow, d.key.encode(), decision_bytes(d))
            self.shadow_published += len(shadow)
            for d in decisions:
                key = d.key.encode()
                value = decision_bytes(d)
                await self._append(self._decisions, key, value)
                if d.policy.mode == "enforce" and self.state_changes.publish(d):
                    await self._append(self._state, key, value, self._state_headers)
                    self.state_published += 1
            self.decisions_published += len(decisions)
        except Exception as exc:  # e.g. no metadata for a topic yet: flush() raises it to the caller
            self._failed = self._failed or exc
            return
        if (self._full or self._open) and (self._pump is None or self._pump.done()):
            self._pump = asyncio.create_task(self._hand_over())

    async def flush(self) -> None:
        """Return once every staged record is acknowledged (acks=all); raise the first failure."""
        while self._full or self._open or (self._pump is not None and not self._pump.done()):
            if self._pump is None or self._pump.done():
                self._pump = asyncio.create_task(self._hand_over())
            await asyncio.wait([self._pump])
        sent, self._sent = self._sent, []
        failed, self._failed = self._failed, None
        results = await asyncio.gather(*sent, return_exceptions=True) if sent else []
        for r in results:
            if isinstance(r, BaseException) and failed is None:
                failed = r
        if failed is not None:
            self._open.clear()
            self._full.clear()
            raise failed

    async def settle(self) -> bool:
        """Wait until everything staged so far is acknowledged or failed, without taking the
        outcome (``flush`` still raises a failure); True when none failed so far."""
        while self._full or self._open or (self._pump is not None and not self._pump.done()):
            if self._pump is None or self._pump.done():
                self._pump = asyncio.create_task(self._hand_over())
            await asyncio.wait([self._pump])
        sent = list(self._sent)
        if sent:
            await asyncio.wait(sent)
        return self._failed is None and not any(f.exception() is not None for f in sent if not f.cancelled())

    async def _append(
        self, topic: str, key: bytes, value: bytes, headers: list[tuple[str, bytes]] | None = None
    ) -> None:
        headers = headers if headers is not None else []  # a list: the client's batch refuses a tuple
        parts = self._partitions.get(topic)
        if parts is None:
            parts = self._partitions[topic] = sorted(await self._producer.partitions_for(topic))
        # The partition the client's own partitioner picks for this key (murmur2), as send() does.
        part = parts[0] if len(parts) == 1 else _PARTITIONER(key, parts, parts)
        builder = self._open.get((topic, part))
        if builder is None:
            builder = self._open[(topic, part)] = self._producer.create_batch()
        if builder.append(timestamp=None, key=key, value=value, headers=headers) is None:  # full: next
            self._full.append((topic, part, self._open.pop((topic, part))))
            builder = self._open[(topic, part)] = self._producer.create_batch()
            builder.append(timestamp=None, key=key, value=value, headers=headers)

    async def _hand_over(self) -> None:
        """Hand the staged batches to the client, one at a time and in the order they were filled
        (so a partition's records keep their order); waits here, not in the caller, while a
        partition's previous batch has not left yet, so records staged meanwhile go in one batch."""
        try:
            while self._full or self._open:
                if self._full:
                    topic, part, builder = self._full.popleft()
                else:
                    (topic, part), builder = next(iter(self._open.items()))
                    del self._open[(topic, part)]
                builder.close()  # closed: sent at once, not after the client's linger
                self._sent.append(await self._producer.send_batch(builder, topic, partition=part))
                self.batches_sent += 1
        except Exception as exc:  # raised by flush(), to the caller that retries the publish
            self._failed = self._failed or exc

    async def dead_letter(self, letters: Sequence[DeadLetter], stage: str = "decode") -> list[str]:
        """Publish bounded copies of ``letters``; returns one line per copy the broker refused."""
        failures: list[str] = []
        futures = []
        for d in letters:
            key, value, headers = dead_letter_record(d, stage)
            try:
                futures.append(
                    await self._producer.send(self._deadletter, value=value, key=key, headers=headers)
                )
            except Exception as exc:  # e.g. MessageSizeTooLargeError: count it, never die of it
                _raise_if_transient(exc)
                failures.append(f"{type(exc).__name__}: {exc}")
        if futures:
            for result in await asyncio.gather(*futures, return_exceptions=True):
                if isinstance(result, BaseException):
                    if not isinstance(result, Exception):
                        raise result
                    _raise_if_transient(result)
                    failures.append(f"{type(result).__name__}: {result}")
                else:
                    self.end_offset = max(self.end_offset, int(result.offset) + 1)
        self.dead_letters += len(letters) - len(failures)
        return failures
