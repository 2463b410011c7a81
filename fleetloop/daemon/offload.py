"""Encoding a checkpoint off the event loop, from a consistent copy: a forked child.

A shard's state at 10,000 nodes takes seconds of pure-Python work to encode (``fleetloop bench
checkpoint``), and the state keeps changing while the loop runs, so neither encoding in the loop nor
in a thread (which would read a state being folded into, and hold the GIL) will do. ``fork`` gives
the child an exact copy-on-write image of the state at one instant for the cost of copying page
tables (milliseconds); the child encodes on another core, writes the bytes to a pipe and exits, and
the loop only waits on the pipe (a thread reads it). The child touches nothing but the value and
the encoder: no logging, no Kafka client, no event loop, no cyclic GC (it would dirty every page),
and it leaves with ``os._exit``. Where ``fork`` does not exist, encoding happens in the loop.

The child's CPU is its own (not in the daemon's ``/proc`` figures), so it says how much it used
(:func:`encode_timed_in_child`): its CPU seconds from the fork to the encoded bytes, user and
system (the pages its reads copied included; its exit's teardown not).
"""

from __future__ import annotations

import asyncio
import gc
import os
import struct
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

A = TypeVar("A")
T = TypeVar("T")
_HEAD = struct.Struct("!BdQ")  # status (0 ok, 1 error), the child's CPU seconds, length of what follows


def _child(write_fd: int, encode: Callable[[Any], bytes], value: Any) -> None:  # pragma: no cover
    gc.disable()
    status, data = 0, b""
    try:
        data = encode(value)
    except BaseException as exc:  # reported to the parent, which raises it there
        status, data = 1, f"{type(exc).__name__}: {exc}".encode()[:2000]
    try:
        view = memoryview(_HEAD.pack(status, time.process_time(), len(data)) + data)
        while view:
            view = view[os.write(write_fd, view) :]
    finally:
        os._exit(0)


def _read_all(fd: int, pid: int) -> tuple[int, float, bytes]:
    chunks: list[bytes] = []
    try:
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
    finally:
        os.close(fd)
        os.waitpid(pid, 0)
    raw = b"".join(chunks)
    if len(raw) < _HEAD.size:
        return 1, 0.0, b"the encoding child died without an answer"
    status, cpu_s, n = _HEAD.unpack_from(raw)
    data = raw[_HEAD.size :]
    if len(data) != n:
        return 1, cpu_s, b"the encoding child's answer was cut short"
    return status, cpu_s, data


class OffloadError(RuntimeError):
    """The child failed to encode (its error), or died."""


async def _wait(read_fd: int, pid: int) -> tuple[bytes, float]:
    status, cpu_s, data = await asyncio.to_thread(_read_all, read_fd, pid)
    if status:
        raise OffloadError(data.decode(errors="replace"))
    return data, cpu_s


async def _now(encode: Callable[[Any], bytes], value: Any) -> tuple[bytes, float]:
    t0 = time.process_time()
    data = encode(value)
    return data, time.process_time() - t0


def encode_timed_in_child(
    encode: Callable[[Any], bytes], value: Any
) -> Coroutine[Any, Any, tuple[bytes, float]]:
    """Fork now (``value`` as it is at this instant) and return what awaits ``encode(value)``
    from the child, with the CPU seconds the child used; the loop is free meanwhile. Without
    ``fork``, encodes when awaited."""
    if not hasattr(os, "fork"):
        return _now(encode, value)
    read_fd, write_fd = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        os.close(read_fd)
        os.close(write_fd)
        return _now(encode, value)
    if pid == 0:  # pragma: no cover (the child)
        os.close(read_fd)
        _child(write_fd, encode, value)
    os.close(write_fd)
    return _wait(read_fd, pid)


async def _bytes_of(timed: Coroutine[Any, Any, tuple[bytes, float]]) -> bytes:
    data, _ = await timed
    return data


def encode_in_child(encode: Callable[[Any], bytes], value: Any) -> Coroutine[Any, Any, bytes]:
    """:func:`encode_timed_in_child` without the CPU figure."""
    return _bytes_of(encode_timed_in_child(encode, value))


class Forked:
    """The runtime's offload port (:class:`fleetloop.daemon.runtime.port.Offload`): a checkpoint
    encoded in a forked child, decoded in a thread."""

    def encode_timed(
        self, encode: Callable[[Any], bytes], value: Any
    ) -> Coroutine[Any, Any, tuple[bytes, float]]:
        return encode_timed_in_child(encode, value)

    async def in_thread(self, fn: Callable[[A], T], arg: A) -> T:
        return await asyncio.to_thread(fn, arg)
