"""What every broker fleetloop starts looks like, and the process plumbing they share.

A broker here is a child process on loopback ports: started, waited on until it answers Kafka
metadata, stopped with SIGTERM then SIGKILL. Its console (and, for Apache Kafka, its log4j file)
goes to a log file in a private temp dir; a broker that does not come up raises
:class:`BrokerStartError` quoting the tail of that log.
"""

from __future__ import annotations

import abc
import asyncio
import atexit
import contextlib
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, TYPE_CHECKING, Literal, Protocol, Self

from aiokafka.admin import AIOKafkaAdminClient

from fleetloop.clock import monotonic_s

BrokerKind = Literal["tansu", "kafka"]
BROKER_KINDS: tuple[BrokerKind, ...] = ("tansu", "kafka")
LOOPBACK = "127.0.0.1"
LOG_TAIL_LINES = 20


@dataclass(frozen=True, slots=True)
class BrokerCapabilities:
    """What a broker can do beyond produce / consume / groups (docs/operations.md, "Brokers").

    ``idempotent_producer``: InitProducerId works, so producers may set ``enable_idempotence``.
    ``offsets_for_times``: ListOffsets by timestamp answers correctly, so replays may seek by time;
    without it they scan record timestamps.
    """

    idempotent_producer: bool
    offsets_for_times: bool


class BrokerStartError(RuntimeError):
    """A broker did not come up. ``str()`` names the broker, says why and quotes its log's tail."""

    def __init__(self, broker_kind: str, reason: str, log_tail: str = "") -> None:
        self.broker_kind = broker_kind
        self.reason = reason
        self.log_tail = log_tail
        super().__init__(broker_kind, reason, log_tail)

    def __str__(self) -> str:
        head = f"{self.broker_kind} broker failed to start: {self.reason}"
        if not self.log_tail.strip():
            return head
        return f"{head}\n--- last lines of its log ---\n{self.log_tail.rstrip()}"


class Broker(Protocol):
    """A running (or startable) Kafka-compatible broker on loopback."""

    @property
    def kind(self) -> BrokerKind: ...

    @property
    def bootstrap_servers(self) -> str:
        """``host:port`` for clients; valid once :meth:`start` returned."""
        ...

    @property
    def capabilities(self) -> BrokerCapabilities: ...

    @property
    def log_path(self) -> Path: ...

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def __enter__(self) -> Self: ...

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...


def free_ports(count: int, host: str = LOOPBACK) -> tuple[int, ...]:
    """``count`` distinct ports free on ``host`` right now (all sockets are held until all are picked).

    The usual race applies: another process may take a port between this call and the broker's bind;
    brokers report that as a start failure naming the port.
    """
    with contextlib.ExitStack() as stack:
        ports: list[int] = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((host, 0))
            ports.append(int(sock.getsockname()[1]))
        return tuple(ports)


def free_port(host: str = LOOPBACK) -> int:
    """One port free on ``host`` right now."""
    return free_ports(1, host)[0]


def tail_lines(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of a text file, or ``""`` if it does not exist."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def port_accepts(host: str, port: int, timeout_s: float = 0.5) -> bool:
    """Whether a TCP connect to ``host:port`` succeeds."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


async def _answers_metadata(bootstrap_servers: str, timeout_ms: int) -> bool:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap_servers, request_timeout_ms=timeout_ms)
    try:
        await admin.start()
        cluster = await admin.describe_cluster()
        return bool(cluster.get("brokers"))
    except Exception:  # any failure means "not ready yet"; the caller retries until its deadline
        return False
    finally:
        with contextlib.suppress(Exception):
            await admin.close()


def answers_metadata(bootstrap_servers: str, timeout_ms: int = 3000) -> bool:
    """Whether the broker answers a Metadata request listing at least one broker.

    Runs aiokafka on a private event loop in a helper thread, so it works from synchronous code and
    from inside a running loop alike.
    """
    result: list[bool] = []

    def run() -> None:
        result.append(asyncio.run(_answers_metadata(bootstrap_servers, timeout_ms)))

    worker = threading.Thread(target=run, name="fleetloop-broker-ready", daemon=True)
    worker.start()
    worker.join()
    return bool(result and result[0])


_RUNNING: weakref.WeakSet[ProcessBroker] = weakref.WeakSet()


@atexit.register
def _stop_leftovers() -> None:  # a crashed test session must not leave a broker behind
    for broker in list(_RUNNING):
        with contextlib.suppress(Exception):
            broker.stop()


class ProcessBroker(abc.ABC):
    """A broker that is one child process. Subclasses say how to prepare, launch and describe it."""

    kind: BrokerKind
    capabilities: BrokerCapabilities

    def __init__(self, *, start_timeout_s: float, stop_timeout_s: float = 10.0) -> None:
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.startup_s: float | None = None  # measured by start()
        self._host = LOOPBACK
        self._port: int | None = None
        self._dir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._console: IO[bytes] | None = None

    # --- what a subclass provides -------------------------------------------------------------

    @abc.abstractmethod
    def _prepare(self, workdir: Path) -> tuple[int, Sequence[str]]:
        """Write whatever the broker needs into ``workdir``; return (client port, command line)."""

    @abc.abstractmethod
    def _console_path(self, workdir: Path) -> Path:
        """Where the process's stdout and stderr go."""

    @property
    @abc.abstractmethod
    def log_path(self) -> Path:
        """The broker's main log file (valid once start() has begun)."""

    def _log_tail(self) -> str:
        return tail_lines(self.log_path)

    # --- lifecycle ----------------------------------------------------------------------------

    @property
    def workdir(self) -> Path:
        if self._dir is None:
            raise RuntimeError(f"{self.kind} broker has not been started")
        return self._dir

    @property
    def bootstrap_servers(self) -> str:
        if self._port is None:
            raise RuntimeError(f"{self.kind} broker has not been started")
        return f"{self._host}:{self._port}"

    @property
    def pid(self) -> int | None:
        """The broker process's id while it runs (benchmarks read its CPU time)."""
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _fail(self, reason: str) -> BrokerStartError:
        """Stop the process but keep its temp dir, so the whole log can still be read."""
        self._terminate()
        kept = f"; its files are kept in {self._dir}" if self._dir is not None else ""
        error = BrokerStartError(self.kind, f"{reason}{kept}", self._log_tail())
        self._dir = None
        self._port = None
        return error

    def start(self) -> None:
        """Start the process and return once it answers Kafka metadata; else raise BrokerStartError."""
        if self._proc is not None:
            raise RuntimeError(f"{self.kind} broker already started")
        begin = monotonic_s()
        self._dir = Path(tempfile.mkdtemp(prefix=f"fleetloop-{self.kind}-"))
        try:
            self._port, argv = self._prepare(self._dir)
        except BaseException:
            self.stop()  # nothing ran yet: nothing worth keeping
            raise
        console = self._console_path(self._dir)
        console.parent.mkdir(parents=True, exist_ok=True)
        self._console = console.open("wb")
        try:
            self._proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=self._console,
                stderr=subprocess.STDOUT,
                cwd=self._dir,
            )
        except OSError as exc:
            raise self._fail(f"cannot run {argv[0]!r}: {exc}") from exc
        _RUNNING.add(self)
        try:
            self._wait_ready(begin + self.start_timeout_s)
        except BrokerStartError:
            raise  # _fail() already stopped it and kept its files
        except BaseException:  # interrupted (Ctrl-C, a test timeout): leave nothing running
            self.stop()
            raise
        self.startup_s = monotonic_s() - begin

    def _wait_ready(self, deadline_s: float) -> None:
        assert self._proc is not None
        assert self._port is not None
        while True:
            code = self._proc.poll()
            if code is not None:
                raise self._fail(
                    f"process exited with code {code} before it answered on {self.bootstrap_servers}"
                )
            if port_accepts(self._host, self._port) and answers_metadata(self.bootstrap_servers):
                return
            if monotonic_s() > deadline_s:
                raise self._fail(
                    f"no Kafka metadata answer on {self.bootstrap_servers} within {self.start_timeout_s:g} s"
                )
            time.sleep(0.1)

    def stop(self) -> None:
        """SIGTERM, wait up to ``stop_timeout_s``, then SIGKILL; remove the temp dir. Idempotent."""
        self._terminate()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
        self._port = None

    def _terminate(self) -> None:
        proc, self._proc = self._proc, None
        _RUNNING.discard(self)
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=self.stop_timeout_s)
        if self._console is not None:
            self._console.close()
            self._console = None

    def __enter__(self) -> Self:
        if self._proc is None:  # start_broker() hands out started brokers: `with start_broker(...)`
            self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    async def __aenter__(self) -> Self:
        if self._proc is None:
            await asyncio.to_thread(self.start)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await asyncio.to_thread(self.stop)

    def __repr__(self) -> str:
        where = self.bootstrap_servers if self._port is not None else "not started"
        return f"<{type(self).__name__} {self.kind} {where}>"


if TYPE_CHECKING:

    def _process_brokers_are_brokers(broker: ProcessBroker) -> Broker:  # checked by mypy, never run
        return broker
