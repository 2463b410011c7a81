"""The CLI loads a subcommand's modules only when that subcommand runs: ``fleetloop --help`` imports
none of them (it took a second, loading the runtime, the policies, the simulator, the benchmarks and
the edges), and each subcommand's ``--help`` is still the whole of its help."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fleetloop.cli.main import COMMANDS, build_parser, main

REPO = Path(__file__).resolve().parents[2]
# What a subcommand brings in; none of it is needed to list the subcommands.
HEAVY = (
    "fleetloop.cli.commands",
    "fleetloop.daemon.runtime",
    "fleetloop.daemon.replay",
    "fleetloop.policies.registry",
    "fleetloop.bench",
    "fleetloop.sim",
    "fleetloop.whatif",
    "fleetloop.edges",
    "numpy",
    "aiokafka",
    "aiohttp",
    "openai",
    "litellm",
)


def modules_after(*words: str) -> set[str]:
    """The modules a fresh interpreter has loaded after ``fleetloop words`` (which exit through --help)."""
    script = (
        "import json, sys\n"
        "from fleetloop.cli.main import main\n"
        "try:\n"
        f"    main({list(words)!r})\n"
        "except SystemExit:\n"
        "    pass\n"
        "sys.stderr.write(json.dumps(sorted(sys.modules)))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=120,
        check=True,
    )
    return set(json.loads(done.stderr))


def loaded(modules: set[str], prefix: str) -> bool:
    return any(m == prefix or m.startswith(prefix + ".") for m in modules)


def test_the_top_level_help_loads_no_subcommand() -> None:
    modules = modules_after("--help")
    assert [m for m in HEAVY if loaded(modules, m)] == []


def test_a_subcommand_loads_its_own_modules_only() -> None:
    modules = modules_after("sim", "--help")
    assert loaded(modules, "fleetloop.sim.command")
    others = ("fleetloop.cli.commands", "fleetloop.daemon.runtime", "fleetloop.bench", "fleetloop.edges")
    assert [m for m in others if loaded(modules, m)] == []


def _subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction:  # type: ignore[type-arg]
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))


def test_the_table_lists_every_command_with_the_help_its_module_gives_it() -> None:
    whole = _subparsers(build_parser(environ={}))
    assert list(whole.choices) == list(COMMANDS)
    helps = {a.dest: a.help for a in whole._choices_actions}
    assert helps == {name: line for name, (line, _) in COMMANDS.items()}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_each_subcommand_s_help_is_the_whole_of_it(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    whole = _subparsers(build_parser(environ={})).choices[command]
    with pytest.raises(SystemExit) as done:
        main([command, "--help"])
    assert done.value.code == 0
    assert capsys.readouterr().out == whole.format_help()
    assert len(whole._actions) > 1  # more than -h: the complete parser, not a listing stub
