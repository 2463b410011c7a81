"""``make kafka-up`` / ``make kafka-down``: one Apache Kafka on this machine, in the background.

``python -m fleetloop.daemon.brokers.local up [--port 9092] [--dir DIR] [--fresh]`` starts Apache
Kafka 4.x (the jars ``make kafka`` fetched) as a single-node KRaft broker and controller on
``127.0.0.1:PORT``, with exactly the configuration the integration tests run
(:func:`fleetloop.daemon.brokers.apache.render_server_properties`: no auto-created topics, one
replica, groups that form at once), and returns once it answers Kafka metadata. Unlike the tests'
brokers it outlives the command and keeps its data: ``DIR`` (default ``.cache/kafka-local``) holds
``server.properties``, ``data/``, ``logs/server.log`` and ``logs/kafka.out``, and ``kafka.json``
(pid, bootstrap, version) while it runs. ``up`` on a running broker says so and leaves it;
``--fresh`` deletes ``DIR/data`` first (a new, empty cluster). ``down`` stops it (SIGTERM, SIGKILL
after ``--stop-timeout-s``) and keeps the data for the next ``up``; ``status`` exits 0 while it runs.
The controller listens on ``PORT + 1``.

Problems a user can fix (no jars, no Java, a port taken, a bad flag) are one line on stderr and exit
2; a broker that does not come up is one line naming its log, exit 1.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from fleetloop.clock import monotonic_s
from fleetloop.daemon.brokers.apache import (
    REPO_ROOT,
    check_install,
    format_storage,
    java_command,
    kafka_home,
    kafka_version,
    render_server_properties,
)
from fleetloop.daemon.brokers.base import LOOPBACK, BrokerStartError, answers_metadata, port_accepts

DEFAULT_DIR = REPO_ROOT / ".cache" / "kafka-local"
STATE = "kafka.json"
PROG = "kafka-local"  # the make targets name the action: kafka-up, kafka-down, kafka-status


class _Refused(Exception):
    """A problem the user can fix: one line, exit 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{PROG}: {message}\n")
        raise SystemExit(2)


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description=__doc__.split("\n\n")[0] if __doc__ else None, allow_abbrev=False)
    sub = p.add_subparsers(dest="action", required=True, parser_class=_Parser)
    up = sub.add_parser(
        "up", help="start Apache Kafka in the background (or say it runs)", allow_abbrev=False
    )
    up.add_argument("--port", type=int, default=9092, help="client port on 127.0.0.1 (default 9092)")
    up.add_argument("--fresh", action="store_true", help="delete the data of an earlier run first")
    up.add_argument("--start-timeout-s", type=float, default=90.0, help="wait this long for it (90)")
    down = sub.add_parser("down", help="stop it (the data stays)", allow_abbrev=False)
    down.add_argument("--stop-timeout-s", type=float, default=30.0, help="SIGKILL after this long (30)")
    st = sub.add_parser("status", help="exit 0 while it runs", allow_abbrev=False)
    for s in (up, down, st):
        s.add_argument("--dir", type=Path, default=DEFAULT_DIR, help=f"its files (default {DEFAULT_DIR})")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    directory: Path = args.dir.resolve()
    try:
        if args.action == "up":
            return up(directory, args.port, fresh=args.fresh, timeout_s=args.start_timeout_s)
        if args.action == "down":
            return down(directory, args.stop_timeout_s)
        return status(directory)
    except _Refused as exc:
        sys.stderr.write(f"kafka-{args.action}: {exc}\n")
        return 2
    except BrokerStartError as exc:
        sys.stderr.write(f"kafka-{args.action}: {exc.reason}\n")
        return 2


def running(directory: Path) -> dict[str, Any] | None:
    """The state file of a broker started from ``directory`` that is still alive, else None."""
    try:
        state = json.loads((directory / STATE).read_text(encoding="utf-8"))
        pid = int(state["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    try:  # alive, and still the broker (a recycled pid runs something else)
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return state if b"kafka.Kafka" in cmdline else None


def up(directory: Path, port: int, *, fresh: bool = False, timeout_s: float = 90.0) -> int:
    if not 1 <= port <= 65534:
        raise _Refused(f"--port {port}: not a port (1-65534; the controller takes the next one)")
    state = running(directory)
    if state is not None:
        print(f"Apache Kafka {state['version']} already runs on {state['bootstrap']} (pid {state['pid']})")
        return 0
    home = kafka_home()
    java = check_install(home)
    for p in (port, port + 1):
        if port_accepts(LOOPBACK, p):
            raise _Refused(f"{LOOPBACK}:{p} is taken by another process; pick another with --port")
    data, logs = directory / "data", directory / "logs"
    if fresh:
        shutil.rmtree(data, ignore_errors=True)
    logs.mkdir(parents=True, exist_ok=True)
    config = directory / "server.properties"
    config.write_text(
        render_server_properties(port=port, controller_port=port + 1, data_dir=data), encoding="utf-8"
    )
    if not (data / "meta.properties").is_file():
        shutil.rmtree(data, ignore_errors=True)
        (directory / "format").mkdir(exist_ok=True)
        format_storage(home, java, directory, config)
    argv = java_command(home, "kafka.Kafka", [str(config)], logs_dir=logs, heap_mb=512, java=java)
    with (logs / "kafka.out").open("ab") as console:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=console,
            stderr=subprocess.STDOUT,
            cwd=directory,
            start_new_session=True,  # not stopped with the shell or make that started it
        )
    bootstrap = f"{LOOPBACK}:{port}"
    version = kafka_version()
    (directory / STATE).write_text(
        json.dumps({"pid": proc.pid, "bootstrap": bootstrap, "version": version, "dir": str(directory)}),
        encoding="utf-8",
    )
    deadline = monotonic_s() + timeout_s
    while not (port_accepts(LOOPBACK, port) and answers_metadata(bootstrap)):
        code = proc.poll()
        if code is not None or monotonic_s() > deadline:
            why = f"exited with code {code}" if code is not None else f"did not answer within {timeout_s:g} s"
            _stop(proc.pid, 10.0)
            (directory / STATE).unlink(missing_ok=True)
            sys.stderr.write(f"kafka-up: Apache Kafka {why}; its log: {logs / 'server.log'}\n")
            return 1
        time.sleep(0.2)
    print(
        f"Apache Kafka {version} is up on {bootstrap} (KRaft, pid {proc.pid}, files in {directory}); "
        "stop it with `make kafka-down`"
    )
    return 0


def down(directory: Path, timeout_s: float = 30.0) -> int:
    state = running(directory)
    if state is None:
        (directory / STATE).unlink(missing_ok=True)
        print(f"Apache Kafka is not running from {directory}")
        return 0
    _stop(int(state["pid"]), timeout_s)
    (directory / STATE).unlink(missing_ok=True)
    print(f"Apache Kafka on {state['bootstrap']} stopped (pid {state['pid']}); its data stays in {directory}")
    return 0


def status(directory: Path) -> int:
    state = running(directory)
    if state is None:
        print(f"Apache Kafka is not running from {directory}")
        return 1
    print(f"Apache Kafka {state['version']} runs on {state['bootstrap']} (pid {state['pid']})")
    return 0


def _stop(pid: int, timeout_s: float) -> None:
    """SIGTERM the broker (a clean shutdown), SIGKILL after ``timeout_s``; it was started in its own
    session, so it is its process group's leader: the group is signalled, nothing else."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
    deadline = monotonic_s() + timeout_s
    while _alive(pid):
        if monotonic_s() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        time.sleep(0.1)


def _alive(pid: int) -> bool:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # reap it when it is our child (started by this process)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie that is not ours to reap is gone for our purposes
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


if __name__ == "__main__":
    raise SystemExit(main())
