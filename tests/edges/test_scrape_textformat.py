"""The fast exposition reader (fleetloop.edges.scrape.textformat) reads every page as
prometheus_client's parser does: the same samples, names and labels, or the same refusal.

Generated pages mix what runtimes write with what they do not (odd escapes, huge and odd numbers,
unicode, samples outside their TYPE's family, exemplars, tabs, no newline at the end); the
fixture pages of every runtime, and the emulated vLLM node's, must be read by the fast reader
itself, not handed to prometheus_client.

Every odd piece the generated pages draw from is also tried in every run on its own, in a line
otherwise well formed (:func:`_each_odd_piece`), and the hostile lines that matter most are named
with whether the fast reader takes them; so a few hundred generated pages (Hypothesis draws are
what costs here) only need to try the pieces together.
"""

from __future__ import annotations

from collections.abc import Iterator
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
ODD_NAMES = ["", "9x", "a b", "é", '"q"', "a-b"]
SUFFIXES = ["", "", "_total", "_bucket", "_sum", "_count", "_created"]
ODD_HEADS = ["", '"q q"', "9x", "a\tb"]  # a HELP or TYPE line's odd family names
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
PADS = ["", " ", "\t", "\r", "\x0b", "\u2028", "\x85"]
PUT_IN = list('{}"\\ ,=#\n\t\x00é')
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
        name = draw(st.sampled_from(ODD_NAMES))
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
        name = draw(st.sampled_from(ODD_HEADS))
    kinds = KINDS + (ODD_KINDS if hostile else [])
    options = [
        f"# HELP {name} {draw(TEXT)}",
        f"# HELP {name}",
        f"# TYPE {name} {draw(st.sampled_from(kinds))}",
        f"# {draw(TEXT)}",
        "#",
    ]
    if hostile:
        options += _odd_comments(name)
    return draw(st.sampled_from(options))


def _odd_comments(name: str) -> list[str]:
    return [f"#x HELP {name} d", f"#  TYPE {name} gauge", f"# HELP  {name}", "# TYPE", '#"a b" TYPE x y']


def _lines(hostile: bool) -> st.SearchStrategy[str]:
    return st.one_of(_sample(hostile), _sample(hostile), _comment(hostile), st.sampled_from(["", "  "]))


@st.composite
def pages(draw: st.DrawFn, hostile: bool) -> str:
    """A page; a hostile one has a few odd lines among well-formed ones, or odd characters."""
    line = st.one_of(_lines(False), _lines(False), _lines(False), _lines(True)) if hostile else _lines(False)
    lines = draw(st.lists(line, max_size=10))
    if hostile and draw(st.booleans()):
        pad = st.sampled_from(["", "", "", *PADS])
        lines = [draw(pad) + ln + draw(pad) for ln in lines]
    text = "\n".join(lines)
    if draw(st.booleans()):
        text += "\n"
    if hostile and text and draw(st.integers(0, 3)) == 0:  # a character put in or dropped anywhere
        at = draw(st.integers(0, len(text)))
        if draw(st.booleans()):
            text = text[:at] + draw(st.sampled_from(PUT_IN)) + text[at:]
        else:
            text = text[:at] + text[at + 1 :]
    return text


def _each_odd_piece() -> Iterator[str]:
    """Pages with one odd piece of the generated pages' each, every piece in every run, in lines
    otherwise well formed: the generated pages then need only try the pieces together."""
    good = 'x{a="b"} 1 1700000000000'
    for name in [*ODD_NAMES, *ODD_FAMILIES]:
        yield f"{name} 1"
        yield f'{name}{{a="b"}} 1'
    for k in ODD_LABEL_NAMES:
        yield f'x{{{k}="v"}} 1'
        yield f'x{{a="b",{k}="v"}} 1'
    for v in [*ESCAPES, "\\", '"']:
        yield f'x{{a="{v}"}} 1'
    blocks = [
        'a="b", c="d"',
        'a="b" ,c="d"',
        'a="b",,c="d"',
        'a="b",',
        'a="b",,',
        ",",
        ' a="b"',
        'a="b" ',
        'a="b""',
    ]
    for block in blocks:
        yield f"x{{{block}}} 1"
    for v in [*VALUES, *ODD_VALUES]:
        yield f"x {v}"
        yield f"x {v} 5"
    for ts in [*TIMESTAMPS, *ODD_TIMESTAMPS]:
        yield f"x 1 {ts}"
    for sep in ["  ", "\t", ""]:
        yield f"x{sep}1"
        yield f"x 1{sep}5"
    for fields in ["5 6", "5 abc", "abc 5", "5 6 7", "5 "]:  # more than a value and a timestamp
        yield f"x 1 {fields}"
    yield f'{good} # {{trace_id="x"}} 1.0'
    for kind in [*KINDS, *ODD_KINDS]:
        yield f"# TYPE x {kind}\nx 1\nx_total 2\nx_bucket 3\nx_sum 4\nx_count 5\nx_created 6"
    for name in ODD_HEADS:
        yield f"# HELP {name} d\n# TYPE {name} counter\n{name} 1"
    for comment in _odd_comments("x"):
        yield f"{comment}\nx 1"
    for pad in PADS:
        yield f"{pad}{good}{pad}\n{pad}# TYPE x gauge{pad}\n{pad}x 2{pad}"
    for at in range(len(good) + 1):
        yield good[:at] + good[at + 1 :]
        for ch in PUT_IN:
            yield good[:at] + ch + good[at:]


def test_each_odd_piece_is_read_or_refused_as_prometheus_client_does() -> None:
    for page in _each_odd_piece():
        for text in (page, f"# HELP x h\n# TYPE x counter\n{page}\nx 2\n"):  # alone, in a family
            _same(text)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pages(hostile=False))
def test_pages_runtimes_write_are_read_fast_and_the_same(text: str) -> None:
    assert _same(text), f"left to prometheus_client: {text!r}"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
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


# The hostile lines named here are held every run, whatever the generated pages reach; each is read
# by the fast reader (True) or left to prometheus_client (False), and either way read the same.
@pytest.mark.parametrize(
    ("text", "fast"),
    [
        ("x " + "9" * 400 + "\n", False),  # int() reads it, float() of the int overflows: refused
        ("x " + "1" * 5000 + "\n", False),  # too long for int(): float() reads it as inf
        ("x -" + "9" * 400 + "\n", False),
        ("x +Inf\nx -Inf\nx NaN\n", True),
        ("x Inf\nx inf\nx nan\nx -inf\n", True),
        ("x Infinity\n", False),  # an infinity not spelt as one
        ("x 1e400\nx -1e400\n", False),
        ("x 1e21\nx 1e22\nx 1e+22\nx 1.7e+09\nx 1e300\n", True),
        ("x 1e-400\n", False),  # a zero with a minus (in its exponent)
        ('x{a="é😀\u2028\x85€"} 1\n', True),
        ("é 1\n", False),
        ("x١ 1\n", False),
        ("x ١٢\n", True),  # int() reads Arabic-Indic digits as float() does
        ('x{a="\\t\\q\\\\"} 1\n', True),  # a backslash before other than \\, " or n stays
        ('x{a="\\"} 1\n', False),  # the quote escaped: the value has no end
        ('x{a="b\\"} 1\n', False),
        ("x 1", True),  # no newline at the end
        ("# TYPE c counter\r\nc 1\r\n\tx 2 \r\n", True),  # whitespace around a line is stripped
        ("# TYPE c counter\nc 1", True),
        ("# TYPE c counter", True),
        ("x 1 " + "9" * 18 + "\n", True),  # far in the future: still read here
        ("x 1 -" + "9" * 18 + "\n", True),
        ("x 1 " + "9" * 19 + "\n", False),  # more than 18 digits: left to prometheus_client
        ("x 1 " + "9" * 400 + "\n", False),  # which refuses it: the milliseconds / 1000 overflow
        ("x 1 " + "9" * 5000 + "\n", False),
    ],
)
def test_hostile_lines_are_read_or_left_to_prometheus_client_as_named(text: str, fast: bool) -> None:
    assert _same(text) is fast


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
