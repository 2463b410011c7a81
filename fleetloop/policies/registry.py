"""The algorithm registry and the policy compiler.

``compile_policy(document)`` checks every section's ``params`` against the named algorithm's
``Params`` model and returns a :class:`CompiledPolicy` stamped with the document's hash. Any
problem raises :class:`PolicyError` with one line naming the field, so the active policy stays in
force (DESIGN.md, "Policy documents").
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import orjson
from pydantic import ValidationError

from fleetloop.policies.base import Algorithm, Params
from fleetloop.policies.slo import DEFAULT_BOOK, SloBook
from fleetloop.schemas.decisions import PolicyStamp
from fleetloop.schemas.errors import one_line
from fleetloop.schemas.policy import SECTIONS, Mode, PolicyDocument, SloSpec
from fleetloop.user_input import UserInputError, read_yaml

T = TypeVar("T")
REGISTRY: dict[str, dict[str, type[Any]]] = {section: {} for section in SECTIONS}


class PolicyError(ValueError):
    """A policy document that cannot take effect. ``str()`` is one line naming the problem."""


def register(section: str, name: str) -> Callable[[type[T]], type[T]]:
    """Class decorator: register an algorithm under ``section`` and a kebab-case ``name``."""
    if section not in REGISTRY:
        raise ValueError(f"unknown policy section {section!r}")

    def deco(cls: type[T]) -> type[T]:
        if name in REGISTRY[section]:
            raise ValueError(f"{section} algorithm {name!r} registered twice")
        cls.name = name  # type: ignore[attr-defined]
        cls.section = section  # type: ignore[attr-defined]
        REGISTRY[section][name] = cls
        return cls

    return deco


def algorithms() -> dict[str, list[str]]:
    """Section -> sorted names of the registered algorithms."""
    _load_builtin()
    return {section: sorted(names) for section, names in REGISTRY.items()}


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
    _load_builtin()
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
        from fleetloop.policies.envelope import Envelope

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


def builtin_policy(name: str = "default") -> CompiledPolicy:
    """A policy document shipped with fleetloop: ``default`` or a baseline (``none``, ``classic``,
    ``modern``, ``llm-d``)."""
    path = BUILTIN_DIR / f"{name}.yaml"
    if not path.exists():
        path = BUILTIN_DIR / "baselines" / f"{name}.yaml"
    if not path.exists():
        raise PolicyError(f"no built-in policy named {name!r}")
    return load_policy(path)


_loaded = False


def _load_builtin() -> None:
    global _loaded  # noqa: PLW0603 - one-time import of the built-in algorithm modules
    if not _loaded:
        _loaded = True
        import fleetloop.policies.builtin  # noqa: F401
