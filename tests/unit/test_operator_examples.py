"""The operator journey's files and lines, checked without a broker (the journey itself runs in
``tests/integration/test_operator_journey.py``): every ``fleetloop`` line of docs/operations.md's journey
parses, the HAProxy config carries the actuator's frontend lines verbatim and names the servers the
backend map does, and the fleet is pinned at the three nodes those name."""

from __future__ import annotations

import re
import shlex

from fleetloop.cli.main import build_parser
from fleetloop.edges.actuate.haproxy.actuator import load_backend_map
from fleetloop.edges.actuate.haproxy.logs import HAPROXY_FRONTEND_SNIPPET, HAPROXY_STREAMING_DEFAULTS
from fleetloop.sim.scenario import load_scenario
from tests.support.journey import REPO, readme_lines

OPERATOR = REPO / "examples" / "operator"


def test_every_fleetloop_line_of_the_journey_parses() -> None:
    lines = [ln for ln in readme_lines() if ln.startswith("fleetloop ")]
    assert len(lines) == 14, lines
    values = {"$BS": "127.0.0.1:9092", "$FROM": "1000", "$TO": "2000", "$P": "0", "$LO": "1", "$HI": "9"}
    for line in lines:
        command = re.split(r" [12]?>| &$", line)[0]
        for k, v in values.items():
            command = command.replace(k, v)
        args = build_parser({}).parse_args(shlex.split(command)[1:])
        assert callable(args.handler), line


def test_the_haproxy_config_and_backend_map_agree() -> None:
    cfg = (OPERATOR / "haproxy.cfg").read_text()
    assert HAPROXY_FRONTEND_SNIPPET in cfg
    assert f"defaults\n    mode http\n{HAPROXY_STREAMING_DEFAULTS}\n" in cfg  # tokens forwarded at once
    servers = dict(re.findall(r"^\s+server (\S+) (127\.0\.0\.1:\d+)", cfg, re.M))
    assert servers == {f"s{i}": f"127.0.0.1:{8100 + i}" for i in range(3)}
    backend_map = load_backend_map(OPERATOR / "backends.yaml")
    text = (OPERATOR / "backends.yaml").read_text()
    assert set(re.findall(r"edge/\d: (s\d)", text)) == set(servers)
    assert "backend edge" in cfg
    assert backend_map is not None
    (pool,) = load_scenario(OPERATOR / "fleet.yaml").pools
    assert (pool.id, pool.nodes, pool.min_nodes, pool.max_nodes) == ("chat-l40s", 3, 3, 3)
