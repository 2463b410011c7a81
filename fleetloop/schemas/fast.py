"""Fast twins of the input wire models: msgspec structs generated from the pydantic models.

The daemon reads telemetry and request outcomes by the hundred thousand per second; validating each
into a pydantic model cost ~8 µs a record, most of it the identifier pattern and the
objects the cyclic collector then walks. A *twin* decodes the same JSON into a ``msgspec.Struct``
(no GC tracking, ~2-4 µs) and accepts **exactly a subset** of what the pydantic model accepts, with
**the same values**:

- the struct is generated from the model's fields (:func:`twin`): same names, defaults, types and
  numeric/length bounds, read from the pydantic ``FieldInfo`` metadata, so hostile's bounds exist in
  one place only (``fleetloop.schemas.base`` and the models) and the exported JSON Schema does not
  change; msgspec is strict (no ``"5"`` for 5, no ``1.0`` for an int) where pydantic is lax;
- identifier patterns are checked outside msgspec (its per-string ``re`` call cost ~1 µs), with the
  model's own pattern anchored as pydantic anchors it (``$`` is end of text, as in Rust's regex, not
  Python's "before a final newline"), memoizing strings already seen valid (a pure function of the
  string: memoizing it cannot change any result);
- the model's ``after`` validators are mirrored by a check registered here (:data:`_AFTER`);
  generating a twin of a model whose validators have no mirror fails at import.

Anything the fast path does not accept goes through ``model.model_validate_json``: a record pydantic
refuses raises pydantic's own ``ValidationError`` (so dead-letter reasons are unchanged, word for
word), one it accepts (a lax-mode coercion) is converted into the struct. So
:meth:`Twin.validate_json` has the contract of ``model_validate_json``, returning a struct.
``tests/unit/test_fast_decode.py`` checks the equivalence over generated and mutated records.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import operator
import re
import types
import typing
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Annotated, Any, Final, Generic, Literal, TypeVar, get_args, get_origin

import msgspec
from annotated_types import Ge, Le, MaxLen, MinLen
from pydantic import BaseModel

from fleetloop.schemas.requests import RequestOutcome
from fleetloop.schemas.telemetry import NodeTelemetry

S = TypeVar("S", bound=msgspec.Struct)

MEMO_MAX: Final = 1 << 16  # identifiers remembered as valid (cleared when full: bounded memory)

# Mirrors of the models' ``@model_validator(mode="after")`` checks: True when the record passes.
# A failing record takes the pydantic path, which raises the model's own message.
_AFTER: dict[type[BaseModel], Callable[[Any], bool]] = {
    RequestOutcome: lambda r: (
        r.cached_prompt_tokens <= r.prompt_tokens
        and (r.outcome == "shed" or r.node_id is not None)
        and (r.diverted_to is None or (r.diverted_to != r.pool_id and r.outcome != "shed"))
    ),
}
_MIRRORED_VALIDATORS: dict[type[BaseModel], frozenset[str]] = {RequestOutcome: frozenset({"_consistent"})}

# Identifier fields that hold a new string on (nearly) every record: checked against the pattern
# directly, never memoized (a memo of them only churns: a miss on every record, and the memo fills
# and clears, evicting the pool and node ids that do repeat). Which fields these are changes the
# cost only, never a result: the check is a pure function of the string either way.
_UNMEMOIZED: dict[type[BaseModel], frozenset[str]] = {RequestOutcome: frozenset({"request_id"})}

# Field shapes whose strings carry a pattern: one string, an optional one, a tuple of them.
_One, _Opt, _Many = "one", "opt", "many"


def python_pattern(pattern: str) -> re.Pattern[str]:
    """A pydantic (Rust regex) pattern ``^...$`` as a Python pattern with the same meaning under
    ``fullmatch``. Only fully anchored patterns without other anchors are twinned."""
    body = pattern.removeprefix("^").removesuffix("$")
    if (
        not (pattern.startswith("^") and pattern.endswith("$") and not pattern.endswith(r"\$"))
        or any(c in body for c in "^$")
        or "\\A" in body
        or "\\z" in body
        or "\\Z" in body
        or "(?" in body
    ):
        raise TypeError(f"cannot twin pattern {pattern!r}: only ^...$ patterns without other anchors")
    return re.compile(body)


def _meta(metadata: list[Any]) -> tuple[dict[str, Any], str | None]:
    """msgspec ``Meta`` arguments and the pattern (checked outside msgspec) of a field's metadata."""
    kw: dict[str, Any] = {}
    pattern: str | None = None
    for m in metadata:
        if isinstance(m, Ge):
            kw["ge"] = m.ge
        elif isinstance(m, Le):
            kw["le"] = m.le
        elif isinstance(m, MinLen):
            kw["min_length"] = m.min_length
        elif isinstance(m, MaxLen):
            kw["max_length"] = m.max_length
        elif getattr(m, "pattern", None) is not None:
            pattern = m.pattern
        elif type(m).__name__ == "AllowInfNan":
            if m.allow_inf_nan:
                raise TypeError("cannot twin a float field that allows inf/NaN (JSON has neither)")
        else:
            raise TypeError(f"cannot twin field constraint {m!r}")
    return kw, pattern


def _flatten(annotation: Any, metadata: list[Any]) -> tuple[Any, list[Any]]:
    while get_origin(annotation) is Annotated:
        base, *extra = get_args(annotation)
        for e in extra:
            metadata = [*list(getattr(e, "metadata", [e])), *metadata]
        annotation = base
    return annotation, metadata


def _field_type(annotation: Any, metadata: list[Any]) -> tuple[Any, str | None, str | None]:
    """(msgspec type, shape of patterned strings or None, pattern) for one pydantic field."""
    annotation, metadata = _flatten(annotation, metadata)
    origin = get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        if len(args) != 1 or len(get_args(annotation)) != 2:
            raise TypeError(f"cannot twin union {annotation!r}: only X | None")
        inner, shape, pattern = _field_type(args[0], metadata)
        return inner | None, (_Opt if shape == _One else shape), pattern
    if origin is tuple:
        targs = get_args(annotation)
        if len(targs) != 2 or targs[1] is not Ellipsis:
            raise TypeError(f"cannot twin {annotation!r}: only tuple[X, ...]")
        inner, shape, pattern = _field_type(targs[0], [])
        if shape not in (None, _One):
            raise TypeError(f"cannot twin {annotation!r}: nested optional/tuple")
        kw, own = _meta(metadata)
        if own is not None:
            raise TypeError("cannot twin a pattern on a tuple")
        t: Any = tuple[inner, ...]  # type: ignore[valid-type]
        return (Annotated[t, msgspec.Meta(**kw)] if kw else t), (_Many if shape else None), pattern
    if origin is Literal or annotation in (int, float, str, bool):
        kw, pattern = _meta(metadata)
        if pattern is not None and annotation is not str:
            raise TypeError("cannot twin a pattern on a non-string")
        t = Annotated[annotation, msgspec.Meta(**kw)] if kw else annotation
        return t, (_One if pattern is not None else None), pattern
    raise TypeError(f"cannot twin field type {annotation!r}")


class Twin(Generic[S]):
    """A pydantic wire model's msgspec struct and the decoder that keeps the model's contract."""

    def __init__(self, model: type[BaseModel], struct: type[S]) -> None:
        self.model = model
        self.struct = struct
        self._decode = msgspec.json.Decoder(struct).decode
        # Patterned string fields, grouped by pattern: (pattern, getter of the single/optional
        # fields as one tuple, names of the tuple fields). The memo holds None (an absent optional).
        # Fields in ``_UNMEMOIZED`` are checked directly (their names, per group).
        unmemoized = _UNMEMOIZED.get(model, frozenset())
        groups: dict[str, tuple[list[str], list[str], list[str]]] = {}
        for name, f in model.model_fields.items():
            _, shape, pattern = _field_type(f.annotation, list(f.metadata))
            if shape is not None and pattern is not None:
                singles, many, direct = groups.setdefault(pattern, ([], [], []))
                if shape == _Many:
                    many.append(name)
                elif name in unmemoized:
                    direct.append(name)
                else:
                    singles.append(name)
        self._groups = tuple(
            (python_pattern(p), operator.attrgetter(*singles) if singles else None, len(singles), tuple(many))
            for p, (singles, many, _) in groups.items()
        )
        self._direct = tuple(
            (python_pattern(p).fullmatch, tuple(direct)) for p, (_, _, direct) in groups.items() if direct
        )
        if unmemoized - {name for _, _, direct in groups.values() for name in direct}:
            raise TypeError(f"cannot twin {model.__name__}: unmemoized fields must be patterned strings")
        self._memo: dict[re.Pattern[str], set[str | None]] = {g[0]: {None} for g in self._groups}
        self._after = _AFTER.get(model)
        self._accepts = self._compile_accepts()

    def _valid_all(self, rx: re.Pattern[str], values: Iterable[str | None]) -> bool:
        """Check strings not yet memoized against the pattern; memoize the valid ones."""
        memo = self._memo[rx]
        for s in values:
            if s in memo:
                continue
            if s is None or rx.fullmatch(s) is None:  # None here: a None where a string belongs
                return False
            if len(memo) >= MEMO_MAX:
                memo.clear()
                memo.add(None)
            memo.add(s)
        return True

    def _compile_accepts(self) -> Callable[[Any], bool]:
        """The checks outside msgspec as one function generated for this twin's fields (as
        ``dataclasses`` generates ``__init__``): per pattern, the single and optional fields read
        as one tuple and looked up in the memo in one ``issuperset`` (only a miss goes to
        :meth:`_valid_all`), each tuple field the same, each unmemoized field matched directly,
        then the mirrored ``after`` validator. The same checks in the same order as a loop over
        ``_groups`` would make, with no loop, tuple or look-up of its own per record: this runs
        once per input record. Field names are the model's (Python identifiers), nothing else
        reaches the source."""
        env: dict[str, Any] = {"valid_all": self._valid_all, "after": self._after}
        lines = ["def accepts(rec):"]
        for k, (rx, singles, n_singles, many) in enumerate(self._groups):
            env[f"rx{k}"], env[f"sup{k}"] = rx, self._memo[rx].issuperset
            gets = [f"g{k}(rec)" if n_singles > 1 else f"(g{k}(rec),)"] if singles is not None else []
            env[f"g{k}"] = singles
            for name in many:
                assert name.isidentifier()
                gets.append(f"rec.{name}")
            for get in gets:
                lines.append(f"    v = {get}")
                lines.append(f"    if not sup{k}(v) and not valid_all(rx{k}, v):")
                lines.append("        return False")
        for j, (fullmatch, names) in enumerate(self._direct):
            env[f"fm{j}"] = fullmatch
            for name in names:
                assert name.isidentifier()
                lines.append(f"    v = rec.{name}")
                lines.append(f"    if v is not None and fm{j}(v) is None:")
                lines.append("        return False")
        lines.append("    return True" if self._after is None else "    return after(rec)")
        exec(compile("\n".join(lines), f"<{self.model.__name__} twin checks>", "exec"), env)  # noqa: S102
        accepts: Callable[[Any], bool] = env["accepts"]
        return accepts

    def validate_json(self, data: bytes | str) -> S:
        """``model.model_validate_json(data)``'s contract, returning the struct: raises pydantic's
        ``ValidationError`` (same message) for a record the model refuses."""
        try:
            rec = self._decode(data)
        except (msgspec.ValidationError, msgspec.DecodeError):
            return self._slow(data)
        if self._accepts(rec):
            return rec
        return self._slow(data)

    def decoder(self) -> tuple[Callable[[bytes], S], Callable[[S], bool], Callable[[bytes], S]]:
        """The parts of :meth:`validate_json` for a caller's own loop (``decode_fast``): the strict
        decoder (raises ``msgspec.ValidationError``/``DecodeError``), the checks outside it, and the
        slow path (pydantic) for a record either refuses."""
        return self._decode, self._accepts, self._slow

    def _slow(self, data: bytes | str) -> S:
        item = self.model.model_validate_json(data)  # raises the model's own ValidationError
        return msgspec.convert(item.model_dump(), self.struct)

    def of(self, item: BaseModel) -> S:
        """The struct holding a (valid) model's values."""
        return msgspec.convert(item.model_dump(), self.struct)


def twin_struct(model: type[BaseModel], name: str) -> type[msgspec.Struct]:
    """Generate the msgspec struct twin of ``model`` (see the module docstring)."""
    if model.model_config.get("extra") != "forbid":
        raise TypeError(f"cannot twin {model.__name__}: it must forbid unknown fields")
    decorators = model.__pydantic_decorators__
    if decorators.field_validators or decorators.validators or decorators.root_validators:
        raise TypeError(f"cannot twin {model.__name__}: field validators have no mirror here")
    validators = frozenset(decorators.model_validators)
    if validators != _MIRRORED_VALIDATORS.get(model, frozenset()):
        raise TypeError(f"cannot twin {model.__name__}: model validators {sorted(validators)} need a mirror")
    fields: list[Any] = []
    for fname, f in model.model_fields.items():
        t, _, _ = _field_type(f.annotation, list(f.metadata))
        if f.is_required():
            fields.append((fname, t))
        elif f.default_factory is not None:
            raise TypeError(f"cannot twin {model.__name__}.{fname}: default factories")
        else:
            fields.append((fname, t, f.default))
    return msgspec.defstruct(
        name,
        fields,
        module=__name__,
        frozen=True,
        kw_only=True,
        forbid_unknown_fields=True,
        gc=False,  # records hold numbers, strings and tuples of strings: never a cycle
    )


if TYPE_CHECKING:
    # What the generated structs hold, for the type checker (the runtime classes below are generated
    # from the pydantic models; tests/unit/test_fast_decode.py checks these lists against them).

    class TelemetryRec(msgspec.Struct, frozen=True, kw_only=True):
        ts_ms: int
        node_id: str
        pool_id: str
        model: str
        gpu_type: str
        gpu_count: int = 1
        weights_state: Literal["cold", "loading", "warm"]
        draining: bool = False
        interval_ms: int
        ttft_p50_ms: float | None = None
        ttft_p99_ms: float | None = None
        tbt_p50_ms: float | None = None
        tbt_p99_ms: float | None = None
        queue_depth: int
        running_requests: int
        queued_prompt_tokens: int = 0
        kv_cache_used_frac: float
        hbm_free_gib: float
        gpu_util_frac: float
        prefix_cache_hit_frac: float = 0.0
        hot_prefixes: tuple[str, ...] = ()
        max_batch_tokens: int = 0
        errors: int = 0
        timeouts: int = 0
        preemptions: int = 0
        requests_completed: int = 0
        prompt_tokens: int = 0
        output_tokens: int = 0
        cost_rate_usd_per_h: float
        engine: str | None = None

    class OutcomeRec(msgspec.Struct, frozen=True, kw_only=True):
        ts_ms: int
        request_id: str
        attempt: int = 0
        workflow_id: str
        step_index: int
        workflow_spend_usd: float = 0.0
        tenant_id: str
        priority: int
        latency_budget_ms: int
        pool_id: str
        node_id: str | None = None
        model: str
        prompt_tokens: int
        cached_prompt_tokens: int = 0
        output_tokens: int = 0
        prefix_digest: str | None = None
        ttft_ms: float | None = None
        e2e_ms: float
        outcome: Literal["ok", "error", "timeout", "shed", "retry"]
        cost_usd: float = 0.0
        task_outcome: Literal["succeeded", "failed"] | None = None
        routed_from: str | None = None
        diverted_to: str | None = None

else:
    TelemetryRec = twin_struct(NodeTelemetry, "TelemetryRec")
    OutcomeRec = twin_struct(RequestOutcome, "OutcomeRec")

TELEMETRY_TWIN: Final[Twin[TelemetryRec]] = Twin(NodeTelemetry, TelemetryRec)
OUTCOME_TWIN: Final[Twin[OutcomeRec]] = Twin(RequestOutcome, OutcomeRec)

# Either form of an input record: the model folds both (the simulator and tests build pydantic models).
Telemetry = NodeTelemetry | TelemetryRec
Outcome = RequestOutcome | OutcomeRec
