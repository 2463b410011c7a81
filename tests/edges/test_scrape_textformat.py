"""The fast exposition reader (fleetloop.edges.scrape.textformat) reads every page as
prometheus_client's parser does: the same samples, names and labels, or the same refusal.

Generated pages mix what runtimes write with what they do not (odd escapes, huge and odd numbers,
unicode, samples outside their TYPE's family, exemplars, tabs, no newline at the end); the
fixture pages of every runtime, and the emulated vLLM node's, must be read by the fast reader
itself, not handed to prometheus_client.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from fleetloop.edges.fleet.metrics import VllmMetrics
from fleetloop.edges.scrape.convert import Exposition, ExpositionError, parse_exposition, slow_exposition
from fleetloop.edges.scrape.textformat import fast_samples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

FIXTURES = Path(__file__).parent / "fixtures"

Flat = dict[str, list[tuple[tuple[tuple[str, str], ...], str]]]


def _flat(samples: dict[str, list[tuple[dict[str, str], float]]]) -> Flat:
    """Samples to compare exactly: labels in their order, values by repr (NaN, -0.0)."""
    return {name: [(tuple(labels.items()), repr(v)) for labels, v in rows] for name, rows in samples.items()}


def _slow(text: str) -> tuple[str, Any]:
    try:
        return "ok", _flat(slow_exposition(text).samples)
    except ExpositionError as exc:
        return "refused", str(exc)


def _both(text: str) -> tuple[str, Any]:
    try:
        return "ok", _flat(parse_exposition(text).samples)
    except ExpositionError as exc:
        return "refused", str(exc)


def _same(text: str) -> bool:
    """The fast reader agrees with prometheus_client's on ``text``; whether it read it itself."""
    slow = _slow(text)
    assert _both(text) == slow, text
    fast = fast_samples(text)
    if fast is not None:
        assert slow == ("ok", _flat(fast)), text
    return fast is not None


# -- generated pages ------------------------------------------------------------------------------

FAMILIES = ["vllm:x", "req", "req_total", "h", "a:b"]
ODD_FAMILIES = ["_total"]  # its counter family would be named ""
SUFFIXES = ["", "", "_total", "_bucket", "_sum", "_count", "_created"]
KINDS = ["counter", "gauge", "histogram", "summary", "untyped"]
ODD_KINDS = ["unknown", "info", "stateset", "bogus", "counter x", ""]
LABEL_NAMES = ["le", "model_name", "engine", "_x", "a1"]
ODD_LABEL_NAMES = ["__name__", "__x", "a:b", "1a", "é", ""]
VALUES = [
    "0", "1", "5.0", "0.42", "1.7e+09", "1e+21", "-3", "NaN", "+Inf", "-Inf", "1e300", "12345678901234567890",
]  # fmt: skip
ODD_VALUES = [
    "-0", "-0.0", "+0", "1_000", "9" * 400, "1" * 5000, "1e400", "١٢", "nan", "Infinity", "0x10", ".5",
    "5.", "inf", "Inf", "abc", "", "1e-400", "+-1", "1.5e3",
]  # fmt: skip
TIMESTAMPS = ["1700000000000", "-5", "0"]
ODD_TIMESTAMPS = ["1.5", "abc", "1e3", "9" * 400, "1_0", "١", "--1", "+5"]
TEXT = st.text(alphabet='ab "\\n{}=,#\t\r\x0b\x85\u2028é€😀', max_size=12)

plain_value = st.text(alphabet=st.characters(exclude_characters='"\\\n'), max_size=20)
ESCAPES = ["a", "\\\\", '\\"', "\\n", "\\t", "é", "😀", "}", "{", ",", "=", " ", "#"]
escaped_value = st.lists(st.sampled_from(ESCAPES), max_size=8).map("".join)
hostile_value = st.lists(st.sampled_from([*ESCAPES, "\\", '"']), max_size=8).map("".join)


def _label_block(draw: st.DrawFn, hostile: bool) -> str:
    names = LABEL_NAMES + (ODD_LABEL_NAMES if hostile else [])
    values = plain_value | escaped_value | (hostile_value if hostile else escaped_value)
    pairs = draw(st.lists(st.tuples(st.sampled_from(names), values), max_size=4))
    if not hostile:
        pairs = list(dict(pairs).items())
    sep = draw(st.sampled_from([","] * 6 + ([", ", " ,", ",,"] if hostile else [])))
    block = sep.join(f'{k}="{v}"' for k, v in pairs)
    if (pairs or hostile) and draw(st.booleans()):
        block += ","
    if hostile and draw(st.integers(0, 5)) == 0:
        block = draw(st.sampled_from([" ", ""])) + block + draw(st.sampled_from([" ", "", '"']))
    return block


@st.composite
def _sample(draw: st.DrawFn, hostile: bool) -> str:
    families = FAMILIES + (ODD_FAMILIES if hostile else [])
    name = draw(st.sampled_from(families)) + draw(st.sampled_from(SUFFIXES))
    if hostile and draw(st.integers(0, 6)) == 0:
        name = draw(st.sampled_from(["", "9x", "a b", "é", '"q"', "a-b"]))
    line = name
    if draw(st.booleans()):
        line += "{" + _label_block(draw, hostile) + "}"
    value = draw(st.sampled_from(VALUES + (ODD_VALUES if hostile else [])))
    sep = draw(st.sampled_from([" "] * 8 + (["  ", "\t", ""] if hostile else [])))
    line += sep + value
    if draw(st.booleans()):
        ts = draw(st.sampled_from(TIMESTAMPS + (ODD_TIMESTAMPS if hostile else [])))
        line += draw(st.sampled_from([" "] * 4 + (["\t", "  "] if hostile else []))) + ts
    if hostile and draw(st.integers(0, 8)) == 0:
        line += ' # {trace_id="x"} 1.0'  # an OpenMetrics exemplar
    return line


@st.composite
def _comment(draw: st.DrawFn, hostile: bool) -> str:
    name = draw(st.sampled_from(FAMILIES + (ODD_FAMILIES if hostile else [])))
    if hostile and draw(st.integers(0, 6)) == 0:
        name = draw(st.sampled_from(["", '"q q"', "9x", "a\tb"]))
    kinds = KINDS + (ODD_KINDS if hostile else [])
    options = [
        f"# HELP {name} {draw(TEXT)}",
        f"# HELP {name}",
        f"# TYPE {name} {draw(st.sampled_from(kinds))}",
        f"# {draw(TEXT)}",
        "#",
    ]
    if hostile:
        options += [
            f"#x HELP {name} d",
            f"#  TYPE {name} gauge",
            f"# HELP  {name}",
            "# TYPE",
            '#"a b" TYPE x y',
        ]
    return draw(st.sampled_from(options))


def _lines(hostile: bool) -> st.SearchStrategy[str]:
    return st.one_of(_sample(hostile), _sample(hostile), _comment(hostile), st.sampled_from(["", "  "]))


@st.composite
def pages(draw: st.DrawFn, hostile: bool) -> str:
    """A page; a hostile one has a few odd lines among well-formed ones, or odd characters."""
    line = st.one_of(_lines(False), _lines(False), _lines(False), _lines(True)) if hostile else _lines(False)
    lines = draw(st.lists(line, max_size=14))
    if hostile and draw(st.booleans()):
        pad = st.sampled_from(["", "", "", "", " ", "\t", "\r", "\x0b", "\u2028", "\x85"])
        lines = [draw(pad) + ln + draw(pad) for ln in lines]
    text = "\n".join(lines)
    if draw(st.booleans()):
        text += "\n"
    if hostile and text and draw(st.integers(0, 3)) == 0:  # a character put in or dropped anywhere
        at = draw(st.integers(0, len(text)))
        if draw(st.booleans()):
            text = text[:at] + draw(st.sampled_from(list('{}"\\ ,=#\n\t\x00é'))) + text[at:]
        else:
            text = text[:at] + text[at + 1 :]
    return text


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pages(hostile=False))
def test_pages_runtimes_write_are_read_fast_and_the_same(text: str) -> None:
    assert _same(text), f"left to prometheus_client: {text!r}"


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pages(hostile=True))
def test_any_page_is_read_or_refused_as_prometheus_client_does(text: str) -> None:
    _same(text)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "\n\n",
        '# HELP c Requests.\n# TYPE c counter\nc 3\nc{a="b"} 4 1700000000000\n',
        "# TYPE c counter\nc_total 3\n",  # not c's sample: an untyped one of its own
        "c 1\n# HELP c x\n# TYPE c counter\n",
        "# HELP c x\nc 1\n# TYPE c counter\nc 2",  # TYPE after a sample still names it _total
        '# TYPE h histogram\nh_bucket{le="+Inf"} 2\nh_sum 1.5\nh_count 2\nh 7\nh_count 1\n',
        '# TYPE s summary\ns{quantile="0.5"} 1\ns_sum 2\ns_count 3\ns_bucket 4\n',
        'x{a="\\\\n",b="\\"}{,=",c="\\t\\\\\\"",d="é😀\u2028"} NaN\n',
        "x -0\n",  # prometheus_client's int() reads 0, not -0.0
        "x 1_0\n",
        "x " + "9" * 400 + "\n",  # int() reads it, float() of the int overflows
        "x " + "9" * 5000 + "\n",  # too long for int(): float() reads it as inf
        "# TYPE c counter\nc 1\n# HELP d x\nd 1\n",  # d's family is untyped: no _total
        "# TYPE h histogram\nh 1\n# TYPE h counter\nh 2\n",  # h 1 is not the histogram's
        'x 1 # {t="1"} 2 3\n',
        "x\t1\nx  2\nx{} 3\r\n",
        "#x HELP y d\ny 1\n",
        "# TYPE _total counter\n_total 1\n",
        "# TYPE g gauge\ng 1e+21 -5\ng +Inf\ng -Inf\n",
        "# TYPE g bogus\ng 1\n",
        'x{a="1",a="2"} 1\n',
        'x{__name__="y"} 1\n',
        'x{a="' + "é" * 2000 + '"} 1\nx{a="' + "é" * 2000 + '"} 2\n',  # too long to be kept: read each time
    ],
)
def test_edge_pages(text: str) -> None:
    _same(text)


# -- the runtimes' pages ------------------------------------------------------------------------


def _vllm_page() -> str:
    node = SimpleNamespace(running=5, queue_depth=2, kv_used=300, capacity=1000)
    m = VllmMetrics(node, "meta-llama/Llama-3.1-8B-Instruct", start_s=1.7e9)  # type: ignore[arg-type]
    for i in range(40):
        m.ttft.observe(0.01 * i)
        m.itl.observe(0.003 * i, 3)
        m.e2e.observe(0.5 * i)
    return m.exposition().decode()


@pytest.mark.parametrize("name", [*sorted(p.name for p in FIXTURES.glob("*.prom")), "emulated vllm"])
def test_runtime_pages_are_read_fast_and_the_same(name: str) -> None:
    text = _vllm_page() if name == "emulated vllm" else (FIXTURES / name).read_text()
    assert _same(text), f"{name} left to prometheus_client"
    expo = parse_exposition(text)
    assert isinstance(expo, Exposition)
    assert expo.samples
