"""The algorithm registry and the policy compiler.

``compile_policy(document)`` checks every section's ``params`` against the named algorithm's
``Params`` model and returns a :class:`CompiledPolicy` stamped with the document's hash. Any
problem raises :class:`PolicyError` with one line naming the field, so the active policy stays in
force (docs/policies.md).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import orjson
from pydantic import ValidationError

from fleetloop.policies import errors
from fleetloop.policies.base import Algorithm, Params
from fleetloop.policies.builtin import ALGORITHMS
from fleetloop.policies.envelope import Envelope
from fleetloop.policies.slo import DEFAULT_BOOK, SloBook
from fleetloop.schemas.decisions import PolicyStamp
from fleetloop.schemas.errors import one_line
from fleetloop.schemas.policy import SECTIONS, Mode, PolicyDocument, SloSpec
from fleetloop.user_input import UserInputError, read_yaml

# Defined in a leaf, so the CLI names it without loading the algorithms; named here for the callers.
PolicyError = errors.PolicyError


def by_section(table: Iterable[type[Any]]) -> dict[str, dict[str, type[Any]]]:
    """Section -> name -> algorithm class, from a table of classes that name themselves."""
    out: dict[str, dict[str, type[Any]]] = {section: {} for section in SECTIONS}
    for cls in table:
        if cls.section not in out:
            raise ValueError(f"{cls.__name__}: unknown policy section {cls.section!r}")
        if cls.name in out[cls.section]:
            raise ValueError(f"{cls.section} algorithm {cls.name!r} named twice")
        out[cls.section][cls.name] = cls
    return out


REGISTRY: Final = by_section(ALGORITHMS)


@dataclass(frozen=True, slots=True)
class Section:
    algorithm: Algorithm
    params: Params
    mode: Mode


@dataclass(frozen=True, slots=True)
class CompiledPolicy:
    document: PolicyDocument
    stamp: PolicyStamp
    sections: dict[str, Section]
    slo: SloBook = DEFAULT_BOOK  # spec.slo, compiled once

    @property
    def tick_ms(self) -> int:
        return self.document.spec.tick_ms


def document_hash(document: PolicyDocument) -> str:
    canonical = orjson.dumps(document.model_dump(mode="json"), option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(canonical).hexdigest()[:16]


def compile_policy(document: PolicyDocument) -> CompiledPolicy:
    sections: dict[str, Section] = {}
    for section in SECTIONS:
        ref = getattr(document.spec, section)
        cls = REGISTRY[section].get(ref.type)
        if cls is None:
            known = ", ".join(sorted(REGISTRY[section])) or "none"
            raise PolicyError(f"spec.{section}.type: unknown algorithm {ref.type!r} (known: {known})")
        try:
            params = cls.Params.model_validate(ref.params)
        except ValidationError as exc:
            raise PolicyError(one_line(exc, f"spec.{section}.params")) from None
        sections[section] = Section(algorithm=cls(), params=params, mode=ref.mode or document.spec.mode)
    try:
        Envelope.model_validate(document.spec.envelope)
    except ValidationError as exc:
        raise PolicyError(one_line(exc, "spec.envelope")) from None
    stamp = PolicyStamp(
        name=document.metadata.name,
        version=document.metadata.version,
        hash=document_hash(document),
        mode=document.spec.mode,
    )
    return CompiledPolicy(
        document=document, stamp=stamp, sections=sections, slo=SloBook.from_spec(document.spec.slo)
    )


def with_slo(policy: CompiledPolicy, slo: SloSpec) -> CompiledPolicy:
    """``policy`` with ``spec.slo`` replaced (a new document: its hash says so)."""
    data = policy.document.model_dump(mode="json")
    data["spec"]["slo"] = slo.model_dump(mode="json")
    return compile_policy(PolicyDocument.model_validate(data))


def parse_document(data: Any, source: str = "<document>") -> PolicyDocument:
    try:
        return PolicyDocument.model_validate(data)
    except ValidationError as exc:
        raise PolicyError(f"{source}: {one_line(exc)}") from None


def load_policy(path: str | Path) -> CompiledPolicy:
    """Read, validate and compile a policy document from a YAML file."""
    p = Path(path)
    try:
        data = read_yaml(p)  # bounded, UTF-8, not empty: one line naming the file
    except UserInputError as exc:
        raise PolicyError(str(exc)) from None
    try:
        return compile_policy(parse_document(data, str(p)))
    except PolicyError as exc:
        msg = str(exc)
        raise PolicyError(msg if msg.startswith(str(p)) else f"{p}: {msg}") from None


BUILTIN_DIR = Path(__file__).parent


def builtin_policy_path(name: str = "default") -> Path:
    """The file of a policy document shipped with fleetloop: ``default`` or a baseline (``none``,
    ``classic``, ``modern``, ``llm-d``)."""
    path = BUILTIN_DIR / f"{name}.yaml"
    if not path.exists():
        path = BUILTIN_DIR / "baselines" / f"{name}.yaml"
    if not path.exists():
        raise PolicyError(f"no built-in policy named {name!r}")
    return path


def builtin_policy(name: str = "default") -> CompiledPolicy:
    """A policy document shipped with fleetloop, compiled (:func:`builtin_policy_path`)."""
    return load_policy(builtin_policy_path(name))
