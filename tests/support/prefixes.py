"""Fresh topic prefixes for integration tests, their topics created before a test asks for one.

Every integration test gets a prefix no other test used, with every registry topic created under it
(:func:`ensure_topics`), so tests never see each other's records. On Apache Kafka a new partition
answers ListOffsets only about 1.1 s after CreateTopics returns (``wait_servable``), a wait the
broker spends idle, not busy: one per test, minutes over a run. A thread makes the prefixes ahead,
a few at a time concurrently, while the tests run; a test takes a ready one at once.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import uuid
from typing import Final

from fleetloop.daemon.brokers import ensure_topics

AHEAD: Final = 3  # prefixes kept ready: the next tests' topics, created while this one runs
TAKE_TIMEOUT_S: Final = 120.0
ATTEMPTS: Final = 3  # a test may pause the broker (SIGSTOP) while topics are being created


class PrefixPool:
    """Prefixes with their registry topics created on ``bootstrap_servers``; each is handed out once."""

    def __init__(self, bootstrap_servers: str, ahead: int = AHEAD) -> None:
        self._bootstrap = bootstrap_servers
        self._ahead = ahead
        self._ready: queue.Queue[str | BaseException] = queue.Queue(maxsize=ahead)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._fill, name="kafka-env-prefixes", daemon=True)
        self._thread.start()

    def take(self) -> str:
        """A fresh prefix whose topics exist and answer; raises what creating them raised."""
        try:
            item = self._ready.get(timeout=TAKE_TIMEOUT_S)
        except queue.Empty:
            raise TimeoutError(f"no topic prefix ready within {TAKE_TIMEOUT_S:g} s") from None
        if isinstance(item, BaseException):
            self._ready.put(item)  # every later test fails the same way
            raise item
        return item

    def close(self) -> None:
        self._stop.set()
        while True:  # unblock a put waiting for room
            try:
                self._ready.get_nowait()
            except queue.Empty:
                break
        self._thread.join(60)

    def _fill(self) -> None:
        failures = 0
        while not self._stop.is_set():
            room = self._ahead - self._ready.qsize()
            prefixes = [f"it-{uuid.uuid4().hex[:10]}" for _ in range(max(room, 1))]
            try:
                asyncio.run(self._create(prefixes))
            except Exception as exc:
                failures += 1
                if failures < ATTEMPTS:
                    continue  # fresh prefixes: a half-created one is never handed out
                self._put(exc)  # handed to the tests that take a prefix
                return
            failures = 0
            for prefix in prefixes:
                self._put(prefix)

    async def _create(self, prefixes: list[str]) -> None:
        await asyncio.gather(*(ensure_topics(self._bootstrap, p) for p in prefixes))

    def _put(self, item: str | BaseException) -> None:
        while not self._stop.is_set():
            try:
                self._ready.put(item, timeout=0.5)
                return
            except queue.Full:
                continue
