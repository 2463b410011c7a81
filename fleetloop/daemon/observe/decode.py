"""Decoding one topic-partition's batch of records into wire models, behind bounds at the door.

Each value is parsed and validated on its own by pydantic-core (JSON parse and validation in Rust,
no intermediate dicts), so exactly the bad records become dead letters with their reason and the
good ones go on; nothing is dropped silently. Measured here, one call per record is as fast as one
call over the batch joined into a JSON array (141k vs 138k telemetry records/s), and the joined form
could let two broken values join into two valid-looking ones, so there is no batch trick.

The door (:class:`Door`) refuses, before and after decoding:

- an empty value (a tombstone or zero bytes), reason ``empty-value``;
- a value larger than ``max_record_bytes`` (checked before any parsing: no record makes the decoder
  allocate more than that), reason ``record-too-large``;
- anything the model refuses: bad JSON, a wrong type, an unknown field, a number outside its
  physical range (the bounds live in the schema: ``fleetloop.schemas.base``);
- a record whose event time (``ts_ms``) lies outside ``[broker timestamp - max_past_ms, broker
  timestamp + max_future_ms]``, reason ``event-time-too-old`` or ``event-time-too-new``: one record
  stamped in the year
  2100 (or in seconds instead of milliseconds) must not move any clock. The broker timestamp is
  the record's own (CreateTime, stamped by the producer's client, or LogAppendTime where the topic
  is configured so); records without one (-1) are not checked.

Nothing a record holds can raise out of :func:`decode_batch`: any exception becomes a dead letter.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

import msgspec
from pydantic import BaseModel, ValidationError

from fleetloop.schemas.errors import one_line
from fleetloop.schemas.fast import Twin

M = TypeVar("M")
P = TypeVar("P", bound=BaseModel)
S = TypeVar("S", bound=msgspec.Struct)

MAX_REASON = 500
EMPTY_VALUE = "empty-value: the record has no value (a tombstone or zero bytes)"


@dataclass(frozen=True, slots=True)
class Door:
    """Bounds every input record passes before it reaches the model.

    ``max_record_bytes``: 128 KiB by default; the largest valid NodeTelemetry (256 hot-prefix
    digests of 200 characters) is about 55 KB. ``max_past_ms`` / ``max_future_ms``: the event-time
    window around the broker timestamp (default -10 min / +30 s); ``None`` turns that check off
    (tests whose records carry synthetic event times near epoch 0).
    """

    max_record_bytes: int = 128 * 1024
    max_past_ms: int | None = 600_000
    max_future_ms: int | None = 30_000

    def without_window(self) -> Door:
        return Door(self.max_record_bytes, None, None)


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A record that could not be decoded: where it came from, its bytes, and why."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int
    reason: str

    @property
    def kind(self) -> str:
        """The reason's class (``record-too-large``, ``json_invalid``, ``less_than_equal``, ...): what
        log summaries and counters group by."""
        return self.reason.split(":", 1)[0].strip() or "unknown"


@dataclass(frozen=True, slots=True)
class Decoded(Generic[M]):
    """Good records (with their offsets, in offset order) and dead letters of one batch."""

    items: list[M]
    offsets: list[int]
    dead: list[DeadLetter]


class RecordLike(Protocol):
    """A consumed record, as decoding reads it (aiokafka's ConsumerRecord has these attributes)."""

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...
    @property
    def timestamp(self) -> int: ...


def reason_of(exc: BaseException) -> str:
    if isinstance(exc, ValidationError):
        text = one_line(exc, with_type=True)
    else:
        text = f"{type(exc).__name__}: {exc}"
    return text[:MAX_REASON]


def digest(data: bytes | None) -> str:
    return hashlib.sha256(data or b"").hexdigest()


def dead_letter_of(r: RecordLike, reason: str) -> DeadLetter:
    return DeadLetter(r.topic, r.partition, r.offset, r.key, r.value, r.timestamp, reason[:MAX_REASON])


def out_of_window(ts_ms: int, broker_ts_ms: int, door: Door) -> str | None:
    """The reason ``ts_ms`` is refused against the broker timestamp, or None when it is inside."""
    if broker_ts_ms < 0:
        return None
    if door.max_past_ms is not None and ts_ms < broker_ts_ms - door.max_past_ms:
        return (
            f"event-time-too-old: ts_ms {ts_ms} is {(broker_ts_ms - ts_ms) / 1000:.0f} s before the "
            f"broker timestamp {broker_ts_ms} (at most {door.max_past_ms / 1000:.0f} s)"
        )
    if door.max_future_ms is not None and ts_ms > broker_ts_ms + door.max_future_ms:
        return (
            f"event-time-too-new: ts_ms {ts_ms} is {(ts_ms - broker_ts_ms) / 1000:.0f} s after the "
            f"broker timestamp {broker_ts_ms} (at most {door.max_future_ms / 1000:.0f} s)"
        )
    return None


SIZE_ONLY = Door(max_past_ms=None, max_future_ms=None)


def decode_batch(model: type[P], records: Sequence[RecordLike], door: Door = SIZE_ONLY) -> Decoded[P]:
    """Decode ``records`` (one topic-partition, offset order) into ``model`` instances.

    ``door`` defaults to the size bound only; the daemon passes its configured :class:`Door`.
    """
    return _decode(model.model_validate_json, records, door)


def decode_fast(twin: Twin[S], records: Sequence[RecordLike], door: Door = SIZE_ONLY) -> Decoded[S]:
    """:func:`decode_batch` into the model's msgspec twin (:mod:`fleetloop.schemas.fast`): the same
    records accepted, the same values, the same dead letters with the same reasons, ~3-4x faster."""

    def pair(
        offset: int, timestamp_ms: int, item: S | None, key: bytes | None, value: bytes | None
    ) -> tuple[int, S | None]:
        return offset, item

    rows, dead = decode_rows(twin, records, door, pair)
    items: list[S] = []
    offsets: list[int] = []
    for offset, item in rows:
        if item is not None:
            items.append(item)
            offsets.append(offset)
    return Decoded(items, offsets, dead)


R = TypeVar("R")


def decode_rows(
    twin: Twin[S],
    records: Sequence[RecordLike],
    door: Door,
    row: Callable[[int, int, S | None, bytes | None, bytes | None], R],
) -> tuple[list[R], list[DeadLetter]]:
    """:func:`decode_fast` as the daemon reads: one ``row(offset, broker timestamp, item, key,
    value)`` per record in offset order (``row(offset, timestamp, None, None, None)`` for one the
    door refused), and the dead letters. Building the shard's rows in this loop saves a second
    pass over the batch; the checks, their order and the reasons are :func:`decode_fast`'s (it is
    this loop)."""
    decode, accepts, slow = twin.decoder()
    rows: list[R] = []
    dead: list[DeadLetter] = []
    limit = door.max_record_bytes
    past = door.max_past_ms if door.max_past_ms is not None else 2**63
    future = door.max_future_ms if door.max_future_ms is not None else 2**63
    check_window = door.max_past_ms is not None or door.max_future_ms is not None
    errors = (msgspec.ValidationError, msgspec.DecodeError)
    # ``_decode``'s loop with ``Twin.validate_json`` inlined (the same checks in the same order):
    # this loop runs once per input record.
    for r in records:
        broker_ts = r.timestamp
        try:
            value = r.value
            if not value:
                dead.append(dead_letter_of(r, EMPTY_VALUE))
                rows.append(row(r.offset, broker_ts, None, None, None))
                continue
            if len(value) > limit:
                dead.append(dead_letter_of(r, f"record-too-large: {len(value)} bytes > {limit}"))
                rows.append(row(r.offset, broker_ts, None, None, None))
                continue
            try:
                item = decode(value)
            except errors:
                item = slow(value)
            else:
                if not accepts(item):
                    item = slow(value)
            if check_window and broker_ts >= 0:
                ts = item.ts_ms  # type: ignore[attr-defined]
                if not (broker_ts - past <= ts <= broker_ts + future):
                    why = out_of_window(int(ts), int(broker_ts), door)
                    if why is not None:
                        dead.append(dead_letter_of(r, why))
                        rows.append(row(r.offset, broker_ts, None, None, None))
                        continue
        except Exception as exc:  # any bytes in: a struct or a dead letter, never an exception out
            dead.append(dead_letter_of(r, reason_of(exc)))
            rows.append(row(r.offset, broker_ts, None, None, None))
            continue
        rows.append(row(r.offset, broker_ts, item, r.key, value))
    return rows, dead


def _decode(validate: Callable[[bytes], M], records: Sequence[RecordLike], door: Door) -> Decoded[M]:
    items: list[M] = []
    offsets: list[int] = []
    dead: list[DeadLetter] = []
    limit = door.max_record_bytes
    check_window = door.max_past_ms is not None or door.max_future_ms is not None
    past = door.max_past_ms if door.max_past_ms is not None else 2**63
    future = door.max_future_ms if door.max_future_ms is not None else 2**63
    for r in records:
        try:
            value = r.value
            if not value:
                dead.append(dead_letter_of(r, EMPTY_VALUE))
                continue
            if len(value) > limit:
                dead.append(dead_letter_of(r, f"record-too-large: {len(value)} bytes > {limit}"))
                continue
            item = validate(value)
            if check_window:
                # Inside the window (the common case) costs two comparisons; the reason is worded
                # only for a record outside it.
                broker_ts, ts = int(r.timestamp), int(getattr(item, "ts_ms", 0))
                if broker_ts >= 0 and not (broker_ts - past <= ts <= broker_ts + future):
                    why = out_of_window(ts, broker_ts, door)
                    if why is not None:
                        dead.append(dead_letter_of(r, why))
                        continue
        except Exception as exc:  # any bytes in: a model or a dead letter, never an exception out
            dead.append(dead_letter_of(r, reason_of(exc)))
            continue
        items.append(item)
        offsets.append(r.offset)
    return Decoded(items, offsets, dead)
