"""README's `make demo` sample names the policy the demo runs: the shipped default's version and
hash, as ``fleetloop demo`` prints them (fleetloop/demo/demo.py), so a retuned default cannot
leave the sample behind."""

from __future__ import annotations

import re
from pathlib import Path

from fleetloop.policies.registry import builtin_policy

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_demo_sample_names_the_shipped_default_policy() -> None:
    lines = re.findall(r"^daemon running: policy (\S+) v(\d+) \(hash ([0-9a-f]{16})\), tick (\d+) ms$",
                       README.read_text(), re.M)  # fmt: skip
    assert len(lines) == 1, lines
    policy = builtin_policy("default")  # `make demo` runs `fleetloop demo` without --policy
    expected = (policy.stamp.name, str(policy.stamp.version), policy.stamp.hash, str(policy.tick_ms))
    assert lines[0] == expected, (
        f"README.md's demo sample says {lines[0]}; the shipped default prints {expected}"
    )
