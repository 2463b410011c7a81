"""``fleetloop bench results``: the committed results in ``bench/results/``, one per benchmark, and
the one command that makes them all again.

::

    fleetloop bench results [--only NAME,...] [--list] [--results DIR]

:data:`RESULTS` is the list: each benchmark's name, the command that makes its result, and the
files it writes. ``--list`` prints it; without it every command (or those ``--only`` names) runs
in turn, from the repository root, one process at a time, and its files replace the committed
ones, each stamped with what made it (:func:`stamp`): the command, the commit of the tree it ran
on, and the date. A JSON result carries that as ``made_by``; a Markdown one ends with a line
``Made by `COMMAND` at commit COMMIT on DATE.``; an HTML report says it above its end.

The simulator's tables are deterministic (they change only when the code does) and take hours of
CPU together; the daemon's benchmarks run brokers and daemons in real time and measure the machine
they run on (each file says how loaded it was where the bench reports it). Results that later ones
read (``--reuse``) come first. A result marked not committed (its run takes longer than the code
it measures has stood still) has no files in ``bench/results``; its command makes them.
"""

from __future__ import annotations

import argparse
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from fleetloop import clock
from fleetloop.daemon.cli_common import UsageError

RESULTS_DIR = Path("bench/results")
OUT = "DIR"  # a command's scratch directory, where it writes files that are renamed into the results
STDOUT = "-"  # a result that is the command's standard output


@dataclass(frozen=True)
class Result:
    """One benchmark's committed result: ``files`` maps what ``command`` writes (a path under its
    scratch directory ``DIR``, or ``-`` for its standard output) to the file it becomes in
    ``bench/results``; a directory is copied whole. ``committed`` False: the files are not in
    ``bench/results`` for the current code (the run takes longer than a change to the code it
    measures has had); the command makes them, and the result is then committed."""

    name: str
    command: str
    files: dict[str, str]
    about: str
    runs: int = 1  # a result of several runs of one command: JSON {"runs": [...]} (stdout only)
    committed: bool = True


def _table(name: str, args: str, about: str, *, committed: bool = True) -> Result:
    """A simulator suite's table: ``sim-<suite>.md`` and ``.json`` under ``DIR``, renamed ``name``."""
    suite = re.search(r"--suite (\w+)", args)
    stem = f"sim-{suite.group(1)}" if suite else "sim-table"
    if "--ablation" in args and suite:
        stem += "-ablation"
    return Result(
        name,
        f"python -m fleetloop.sim.table {args} --out {OUT}",
        {f"{OUT}/{stem}.md": f"{name}.md", f"{OUT}/{stem}.json": f"{name}.json"},
        about,
        committed=committed,
    )


def stack_result(
    name: str, scenario: str, arms: str, about: str, *, runs: int = 3, under: str = "", plots: bool = True
) -> Result:
    """A ``fleetloop bench stack`` result: ``scenarios/stack/<scenario>.yaml`` over ``arms``, ``runs``
    runs each, its table and figures (and its two plots, when ``plots``) kept as
    ``stack/<under>stack-<scenario>.*``."""
    tails = (".md", ".json", ".png", "-arms.png") if plots else (".md", ".json")
    return Result(
        name,
        f"fleetloop bench stack --scenario scenarios/stack/{scenario}.yaml --arms {arms} "
        f"--runs {runs} --out {OUT}",
        {f"{OUT}/stack-{scenario}{t}": f"stack/{under}stack-{scenario}{t}" for t in tails},
        about,
    )


RESULTS: tuple[Result, ...] = (
    # The simulator: deterministic, minutes to hours of CPU each, one worker process.
    Result(
        "sim-table",
        f"python -m fleetloop.sim.table --ablation --workers 1 --out {OUT}",
        {f"{OUT}/{stem}": stem for stem in ("sim-table.md", "sim-table.json", "sim-ablation.md")},
        "every shipped scenario under none, classic, modern and default, and default with each lever off",
    ),
    _table(
        "sim-shipped",
        "--suite shipped --seeds 5 --policies classic,modern,default --workers 1",
        "the shipped scenarios over 5 seeds against the targets",
    ),
    _table(
        "sim-stress",
        "--suite stress --seeds 5 --policies classic,modern,default --workers 1",
        "the stress scenarios over 5 seeds against the targets",
    ),
    _table(
        "sim-shipped-10-seeds",
        "--suite shipped --seeds 10 --policies classic,default --reuse bench/results/sim-shipped.json "
        "--reuse-policies classic,default --workers 1",
        "the shipped suite over 10 seeds (the first five reused from sim-shipped), classic and default",
    ),
    _table(
        "sim-stress-10-seeds",
        "--suite stress --seeds 10 --policies classic,default --reuse bench/results/sim-stress.json "
        "--reuse-policies classic,default --workers 1",
        "the stress suite over 10 seeds (the first five reused from sim-stress), classic and default",
        committed=False,  # over an hour of CPU
    ),
    _table(
        "sim-stress-ablation",
        "--suite stress --seeds 3 --ablation --policies classic,modern,default "
        "--reuse bench/results/sim-stress.json --reuse-policies classic,modern,default --workers 1",
        "the stress suite over 3 seeds with each lever of the default policy off in turn",
        committed=False,  # over an hour of CPU
    ),
    _table(
        "sim-fleet",
        "--suite fleet --seeds 1 --policies classic,modern,default --workers 1",
        "1,024 nodes in 32 pools, one seed",
    ),
    Result(
        "cascade",
        "fleetloop sim --scenario scenarios/cascade-degraded-gpu.yaml --compare none,classic,modern,default "
        f"--report {OUT}/cascade",
        {f"{OUT}/cascade": "cascade"},
        "the cascade scenario's timelines under none, classic, modern and default (HTML and PNG)",
    ),
    Result(
        "calibration",
        f"python -m fleetloop.sim.calibrate --out {OUT}/calibration.md",
        {f"{OUT}/calibration.md": "calibration.md"},
        "the node model against published measurements, fitting and held-out halves",
    ),
    # The daemon: real brokers and processes in real time; figures depend on the machine.
    Result(
        "decide",
        "fleetloop bench decide --nodes 10000 --ticks 20 --json",
        {STDOUT: "decide.json"},
        "one whole-fleet tick at 10,000 nodes: fold, snapshot and decide, p50 / p99",
    ),
    Result(
        "decide-1m-workflows",
        "fleetloop bench decide --nodes 10000 --workflows 1000000 --ticks 5 --warmup 4 --json",
        {STDOUT: "decide-1m-workflows.json"},
        "the same with 1,000,000 open tasks: RSS, and a new task's outcome at the ledger's cap",
    ),
    Result(
        "ingest",
        "fleetloop bench ingest --events 100000 --broker both --json",
        {STDOUT: "ingest.json"},
        "events per CPU-second through the daemon's door and fold, against aiokafka + orjson and faust",
        runs=3,
    ),
    Result(
        "latency-1000-kafka",
        "fleetloop bench latency --nodes 1000 --trials 20 --outcomes-per-node 1 --daemons 1 "
        "--broker kafka --json",
        {STDOUT: "latency-1000-kafka.json"},
        "a node failing every call to its enforced open breaker on control.state, and flaps",
    ),
    Result(
        "latency-1000-tansu",
        "fleetloop bench latency --nodes 1000 --trials 20 --outcomes-per-node 1 --daemons 1 "
        "--broker tansu --json",
        {STDOUT: "latency-1000-tansu.json"},
        "the same on the embedded broker",
    ),
    Result(
        "latency-10000-kafka",
        "fleetloop bench latency --nodes 10000 --trials 20 --broker kafka --daemons 4 --json",
        {STDOUT: "latency-10000-kafka.json"},
        "breaker latency at 10,000 nodes with four daemons",
    ),
    Result(
        "latency-10000-tansu",
        "fleetloop bench latency --nodes 10000 --trials 20 --broker tansu --daemons 4 --json",
        {STDOUT: "latency-10000-tansu.json"},
        "the same on the embedded broker",
    ),
    Result(
        "sizing-1500",
        "fleetloop bench sizing --nodes 1500 --seconds 30 --broker kafka --json",
        {STDOUT: "sizing-1500.json"},
        "one daemon at the sizing rule's size in real time: ticks decided, lag, CPU per fleet-second",
    ),
    Result(
        "sizing-3000",
        "fleetloop bench sizing --nodes 3000 --seconds 30 --broker kafka --json",
        {STDOUT: "sizing-3000.json"},
        "the same at twice the rule's size",
    ),
    Result(
        "sizing-10000",
        "fleetloop bench sizing --nodes 10000 --seconds 30 --broker kafka --outcomes-per-node 0.5 --json",
        {STDOUT: "sizing-10000.json"},
        "one daemon far beyond the rule: how far behind it falls under overload, and how soon it is current",
    ),
    Result(
        "sizing-10000-10-minutes",
        "fleetloop bench sizing --nodes 10000 --daemons 3 --seconds 600 --broker kafka --json",
        {STDOUT: "sizing-10000-10-minutes.json"},
        "10,000 nodes for ten minutes, three daemons: rebalances, longest loop stalls and where, GC",
    ),
    Result(
        "rollup-kafka",
        "fleetloop bench rollup --boundaries 60 --broker kafka --json",
        {STDOUT: "rollup-kafka.json"},
        "the last shard summary to the fleet figure on control.state",
    ),
    Result(
        "rollup-tansu",
        "fleetloop bench rollup --boundaries 60 --json",
        {STDOUT: "rollup-tansu.json"},
        "the same on the embedded broker",
    ),
    Result(
        "checkpoint",
        "fleetloop bench checkpoint --nodes 1000,10000 --seconds 30 --json",
        {STDOUT: "checkpoint.json"},
        "a shard checkpoint's size, encode and decode CPU, and the restore's stall",
    ),
    Result(
        "router",
        "fleetloop bench router --json",
        {STDOUT: "router.json"},
        "microseconds per pick of the router library by pool size, against the same picks uncached",
    ),
    Result(
        "fuzz",
        "fleetloop bench fuzz --json",
        {STDOUT: "fuzz.json"},
        "hostile and flooding input: crashes, dead letters, and decisions against a clean run",
    ),
    Result(
        "soak",
        "fleetloop bench soak --minutes 3 --json",
        {STDOUT: "soak.json"},
        "twice the daemon's capacity for minutes: lag, RSS and ticks stay bounded",
    ),
    Result(
        "stack-router-overhead",
        f"fleetloop bench stack --scenario scenarios/stack/degraded-gpu.yaml --overhead --out {OUT}",
        {f"{OUT}/router-overhead.{ext}": f"stack/router-overhead.{ext}" for ext in ("md", "json")},
        "what each router's data path adds to a streamed call's first token, over two idle nodes",
    ),
    stack_result(
        "stack-degraded-gpu-three-routers",
        "degraded-gpu",
        "vllm-cache-aware,fleetloop-vllm,sglang-cache-aware,fleetloop-sglang,haproxy-leastconn,fleetloop-haproxy",
        "vllm-router, SGLang's router and HAProxy alone and driven by fleetloop, degraded GPUs, 3 runs each",
    ),
    stack_result(
        "stack-prefix-heavy-vllm-router",
        "prefix-heavy",
        "vllm-cache-aware,fleetloop-vllm",
        "vllm-router cache_aware alone and driven by fleetloop, prefix-heavy agents, 3 runs each",
    ),
    stack_result(
        "stack-degraded-gpu-autoscale-probe",
        "degraded-gpu",
        "fleetloop-vllm,fleetloop-haproxy",
        "why fleetloop driving HAProxy gave nodes back later: each run's autoscale record, one run per arm "
        "(before callers marked a task's last call)",
        runs=1,
        under="autoscale-probe/",
        plots=False,
    ),
    stack_result(
        "stack-degraded-gpu-autoscale-probe-final-call",
        "degraded-gpu",
        "fleetloop-vllm,fleetloop-haproxy",
        "the same probe once the agents mark each task's last call (x-fleetloop-final)",
        runs=1,
        under="autoscale-probe-final/",
        plots=False,
    ),
    stack_result(
        "stack-degraded-gpu-headline-pair",
        "degraded-gpu",
        "vllm-cache-aware,fleetloop-haproxy",
        "the degraded-GPU headline pair again once the agents mark each task's last call, 3 runs each",
        under="headline/",
        plots=False,
    ),
    stack_result(
        "stack-degraded-gpu-vllm-router-outcomes",
        "degraded-gpu",
        "vllm-cache-aware,fleetloop-vllm",
        "vllm-router cache_aware alone and driven by fleetloop once fleetloop reads the router's outcome "
        "counters (--metrics-url), degraded GPUs, 3 runs each",
        under="vllm-outcomes/",
    ),
    stack_result(
        "stack-degraded-gpu-litellm",
        "degraded-gpu",
        "litellm-simple-shuffle,litellm-least-busy,litellm-latency,fleetloop-litellm",
        "LiteLLM's proxy alone with each of its three strategies (simple-shuffle, least-busy, "
        "latency-based) and with fleetloop's callback in it, degraded GPUs, 3 runs each",
        under="litellm/",
        plots=False,
    ),
    stack_result(
        "stack-burst-cold-litellm",
        "burst-cold",
        "litellm-simple-shuffle,litellm-least-busy,fleetloop-litellm",
        "LiteLLM's proxy alone (simple-shuffle, least-busy) and with fleetloop's callback in it, a 2.5x "
        "burst with 45 s cold starts, 3 runs each",
        under="litellm/",
        plots=False,
    ),
)

MADE_BY_MD = re.compile(r"\n*\n---\nMade by `[^`]*` at commit [0-9a-f]{40} on [0-9TZ:-]+\.\n\Z")


def by_name(name: str) -> Result:
    found = [r for r in RESULTS if r.name == name]
    if not found:
        raise KeyError(name)
    return found[0]


def made_by(command: str, commit: str, date: str, **more: Any) -> dict[str, Any]:
    return {"command": command, "commit": commit, "date": date, **more}


def strip_made_by(text: str) -> str:
    """A Markdown result without its stamp: what the command itself wrote."""
    return MADE_BY_MD.sub("\n", text)


def stamp(path: Path, by: dict[str, Any]) -> None:
    """Say in the file what made it (replacing an earlier stamp)."""
    line = f"Made by `{by['command']}` at commit {by['commit']} on {by['date']}."
    if path.is_dir():
        for html in sorted(path.glob("*.html")):
            stamp(html, by)
        return
    if path.suffix == ".json":
        data = orjson.loads(path.read_bytes())
        if not isinstance(data, dict):
            data = {"result": data}
        data.pop("made_by", None)
        path.write_bytes(orjson.dumps({"made_by": by, **data}, option=orjson.OPT_INDENT_2) + b"\n")
    elif path.suffix == ".md":
        path.write_text(strip_made_by(path.read_text()).rstrip("\n") + f"\n\n---\n{line}\n")
    elif path.suffix == ".html":
        text = re.sub(r"<p class=\"made-by\">.*?</p>\n", "", path.read_text())
        tag = line.replace("`", "")
        path.write_text(text.replace("</body>", f'<p class="made-by">{tag}</p>\n</body>', 1))


def _argv(command: str, scratch: Path) -> list[str]:
    words = shlex.split(command.replace(OUT, str(scratch)))
    if words[0] == "fleetloop":
        return [sys.executable, "-m", "fleetloop", *words[1:]]
    if words[0] == "python":
        return [sys.executable, *words[1:]]
    return words


def _commit(root: Path) -> str:
    out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise UsageError("fleetloop bench results runs from a git checkout (each result names its commit)")
    return out.stdout.strip()


def run(result: Result, root: Path, results_dir: Path) -> None:
    """Run one benchmark's command from ``root`` and put its files, stamped, in ``results_dir``."""
    commit = _commit(root)
    date = datetime.fromtimestamp(clock.wall_ms() / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    with tempfile.TemporaryDirectory(prefix=f"bench-{result.name}-") as tmp:
        scratch = Path(tmp)
        outputs: list[bytes] = []
        for _ in range(result.runs):
            done = subprocess.run(
                _argv(result.command, scratch),
                cwd=root,
                stdout=subprocess.PIPE,
                check=False,
            )
            if done.returncode != 0:
                raise UsageError(f"{result.name}: `{result.command}` exited {done.returncode}")
            outputs.append(done.stdout)
        by = made_by(result.command, commit, date)
        for made, name in result.files.items():
            dest = results_dir / name
            if made == STDOUT:
                runs = [orjson.loads(o) for o in outputs]
                body = runs[0] if result.runs == 1 else {"runs": runs}
                dest.write_bytes(orjson.dumps(body))
            else:
                src = scratch / made.removeprefix(f"{OUT}/")
                if dest.is_dir():
                    shutil.rmtree(dest)
                if src.is_dir():
                    shutil.copytree(src, dest)
                else:
                    shutil.copyfile(src, dest)
            stamp(dest, by)
        print(f"{result.name}: {', '.join(result.files.values())}", flush=True)


def register(sub: Any) -> None:
    p = sub.add_parser("results", help="make bench/results again: every benchmark's committed result")
    p.add_argument("--only", default="", metavar="NAME,...", help="these results only (default: every one)")
    p.add_argument("--list", action="store_true", help="print each result's files and command; run none")
    p.add_argument(
        "--results", default=str(RESULTS_DIR), metavar="DIR", help="where they go (default bench/results)"
    )
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    names = [n for n in args.only.split(",") if n]
    unknown = [n for n in names if n not in {r.name for r in RESULTS}]
    if unknown:
        raise UsageError(f"--only: no result named {', '.join(unknown)} (see --list)")
    chosen = [r for r in RESULTS if not names or r.name in names]
    if args.list:
        for r in chosen:
            note = "" if r.committed else " (not committed)"
            print(f"{r.name}\t{', '.join(r.files.values())}{note}\t{r.command}")
        return 0
    root = Path.cwd()
    results_dir = Path(args.results)
    if not results_dir.is_dir():
        raise UsageError(f"--results: {results_dir} is not a directory")
    for r in chosen:
        run(r, root, results_dir)
    return 0
