"""A fast reader of Prometheus text exposition (0.0.4) that gives what prometheus_client's gives.

prometheus_client's ``text_string_to_metric_families`` costs about 27 µs a line (3.6 ms for a
133-line vLLM page): at one scrape a second, a core for every ~275 nodes. :func:`fast_samples` reads
the pages runtimes write (``name{label="value",...} value [timestamp]``, ``# HELP``/``# TYPE``
lines, comments, blank lines) in about 2 µs a line (6 the first time a line's name and labels are
seen: they are kept by the text before the value), and returns ``None`` for a page holding anything
else (a line it does not know to be read the same way), which the caller then gives to
prometheus_client: so a page's samples, and which pages are refused with what message, stay
prometheus_client's.

What it keeps of prometheus_client's reading, flattened to samples (families are not kept):

- Lines split on ``\\n`` only and are stripped of whitespace at both ends.
- ``# HELP name`` with another name than the current family's, or ``# TYPE name type``, starts a
  family (HELP: untyped until a TYPE says otherwise). Samples belong to it if named as its type
  allows (histogram: ``_bucket``, ``_sum``, ``_count``; summary: those but ``_bucket``, and the name;
  otherwise the name). A sample that does not belong ends the family and is an untyped one of its
  own, as is every following one until a HELP or TYPE.
- A counter family whose name lacks ``_total`` names its samples with it, when the family ends (a
  TYPE after the samples counts).
- Label values unescape ``\\\\``, ``\\"`` and ``\\n``; any other backslash stays as it is.
- A value is read as an int, else a float; a timestamp is read and dropped.

Sent to prometheus_client instead (all rare on real pages): a name or label name out of the legacy
character set, a label name starting ``__``, quoted names, more than one space between fields,
tabs, text around a label pair, duplicate label names, values with ``_``, a zero with a minus, an infinity or
NaN not spelt as one (an integer too big for a float), timestamps that are not integer
milliseconds, more than two fields after the labels (an exemplar), TYPE other than counter, gauge,
histogram, summary or untyped, a family named ``_total``, and a comment with ``HELP`` or ``TYPE``
in it that is not a well-formed HELP or TYPE line.
"""

from __future__ import annotations

import re

Samples = dict[str, list[tuple[dict[str, str], float]]]

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = r"[a-zA-Z_][a-zA-Z0-9_]*"
_QUOTED = r'"[^"\\]*(?:\\.[^"\\]*)*"'
_PAIR = rf"{_LABEL}={_QUOTED}"
_BLOCK = re.compile(rf"(?:{_PAIR}(?:,{_PAIR})*,?)?", re.DOTALL)  # what a label block must be
_PAIRS = re.compile(rf'({_LABEL})="([^"\\]*(?:\\.[^"\\]*)*)"', re.DOTALL)
_ESCAPE = re.compile(r'\\[\\n"]')
_UNESCAPED = {"\\\\": "\\", "\\n": "\n", '\\"': '"'}
_SPELT_OUT = frozenset({"NaN", "nan", "+Inf", "-Inf", "Inf", "+inf", "-inf", "inf"})
_SUFFIXES = {
    "counter": ("",),
    "gauge": ("",),
    "untyped": ("",),
    "summary": ("_count", "_sum", ""),
    "histogram": ("_count", "_sum", "_bucket"),
}
_KEPT = 4096  # sample heads kept read: a fleet's pages repeat the same few hundred
_KEPT_CHARS = 1024  # longer heads are read each time (what is kept stays a few MiB)


class _Unsure(Exception):
    """The page holds something only prometheus_client's parser is known to read right."""


_heads: dict[str, tuple[str, dict[str, str]]] = {}  # sample name and labels by the text before the value


def _unescape(m: re.Match[str]) -> str:
    return _UNESCAPED[m.group(0)]


def _name(name: str) -> str:
    if _NAME.fullmatch(name) is None:
        raise _Unsure
    return name


def _head(head: str) -> tuple[str, dict[str, str]]:
    """A sample line's name and labels (``name`` or ``name{a="x",...}``), checked and kept."""
    brace = head.find("{")
    if brace < 0:
        known: tuple[str, dict[str, str]] = (_name(head), {})
    else:
        block = head[brace + 1 : -1]
        if head[-1:] != "}" or _BLOCK.fullmatch(block) is None:
            raise _Unsure
        pairs = _PAIRS.findall(block)
        labels = {k: (_ESCAPE.sub(_unescape, v) if "\\" in v else v) for k, v in pairs}
        if len(labels) != len(pairs) or any(k.startswith("__") for k in labels):
            raise _Unsure  # a name twice (refused), __name__ or a reserved name
        known = (_name(head[:brace]), labels)
    if len(head) <= _KEPT_CHARS:
        if len(_heads) >= _KEPT:
            _heads.clear()
        _heads[head] = known
    return known


def _timestamp_ok(text: str) -> bool:
    digits = text[1:] if text.startswith("-") else text
    return 0 < len(digits) <= 18 and digits.isascii() and digits.isdigit()


def fast_samples(text: str) -> Samples | None:
    """The page's samples as prometheus_client's reading flattens them, or ``None`` when the page
    holds something this reader leaves to prometheus_client (see the module's docstring)."""
    try:
        return _read(text)
    except _Unsure:
        return None


def _read(text: str) -> Samples:
    out: Samples = {}
    family = ""  # the current family's name ("": none)
    typ = "untyped"
    allowed: tuple[str, ...] = ()
    held: list[tuple[str, dict[str, str], float]] = []  # its samples, named when it ends

    def end() -> None:
        suffix = "_total" if typ == "counter" and not family.endswith("_total") else ""
        for name, labels, value in held:
            out.setdefault(name + suffix, []).append((labels, value))
        held.clear()

    for raw in text.split("\n"):
        line = raw.strip()
        if not line:
            continue
        if line[0] == "#":
            if line.startswith("# HELP "):
                name = _name(line[7:].split(" ", 1)[0])  # the help text is not kept
                if name != family:
                    if family:
                        end()
                    family, typ, allowed = name, "untyped", (name,)
            elif line.startswith("# TYPE "):
                name, _, kind = line[7:].partition(" ")
                suffixes = _SUFFIXES.get(kind)
                if suffixes is None or _name(name) == "_total":
                    raise _Unsure
                if name != family:
                    if family:
                        end()
                    family = name
                typ, allowed = kind, tuple(name + s for s in suffixes)
            elif "HELP" in line or "TYPE" in line:
                raise _Unsure  # e.g. "#x HELP y": prometheus_client reads its second word
            continue
        cut = line.rfind("}") + 1  # no "}" after it: a value or timestamp holding one is refused
        if not cut:
            cut = line.find(" ")
        head = line[:cut]
        known = _heads.get(head)
        if known is None:
            known = _head(head)
        name, labels = known[0], known[1].copy()
        if line[cut : cut + 1] != " ":
            raise _Unsure
        fields = line[cut + 1 :].split(" ")
        tok = fields[0]
        try:
            value = float(tok)
        except ValueError:
            raise _Unsure from None
        # prometheus_client reads an int first: "-0" is 0, and a 400-digit integer overflows
        if "_" in tok or (value == 0.0 and "-" in tok) or (value - value != 0.0 and tok not in _SPELT_OUT):
            raise _Unsure
        if len(fields) == 2:
            if not _timestamp_ok(fields[1]):
                raise _Unsure
        elif len(fields) != 1:
            raise _Unsure  # an exemplar, or spaces in a row
        if name in allowed:
            held.append((name, labels, value))
            continue
        if family:
            end()
        family, typ, allowed = "", "untyped", ()
        out.setdefault(name, []).append((labels, value))
    if family:
        end()
    return out
