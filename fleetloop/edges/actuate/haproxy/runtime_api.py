"""HAProxy's runtime API (the "stats socket" at ``level admin``), over a unix socket or loopback TCP.

One connection per exchange in non-interactive mode: commands joined by ``;`` on one line, HAProxy
answers and closes. Addresses: ``unix:/path``, ``/path`` (a unix socket), or ``HOST:PORT`` where
HOST must be a loopback address (nothing may reach beyond loopback).
"""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Sequence

READ_LIMIT = 16 * 1024 * 1024
# A batch of commands goes out in exchanges of at most this many bytes per line, so one exchange
# never depends on how much of a line HAProxy's buffers (tune.bufsize) take (HAProxy 2.6 was seen
# to take a 36 kB line; nothing promises it).
MAX_LINE_BYTES = 8 * 1024


class RuntimeApiError(Exception):
    """The runtime API could not be reached or refused a command."""


def parse_address(addr: str) -> tuple[str, str | int]:
    """``("unix", path)`` or ``("tcp", "host:port")`` as (host, port); raises ValueError with one line."""
    if addr.startswith("unix:"):
        return "unix", addr[5:]
    if addr.startswith("/"):
        return "unix", addr
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"--runtime-api {addr!r}: want unix:/path or HOST:PORT")
    host = host.strip("[]")
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if not loopback:
        raise ValueError(f"--runtime-api {addr!r}: TCP only on a loopback address")
    return "tcp", f"{host}:{port}"


class RuntimeApi:
    def __init__(self, addr: str, timeout_s: float = 3.0) -> None:
        self.kind, self.where = parse_address(addr)
        self.addr = addr
        self.timeout_s = timeout_s

    async def _open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self.kind == "unix":
            return await asyncio.open_unix_connection(str(self.where), limit=READ_LIMIT)
        host, _, port = str(self.where).rpartition(":")
        return await asyncio.open_connection(host, int(port), limit=READ_LIMIT)

    async def run(self, commands: Sequence[str]) -> str:
        """Send ``commands`` (in as few exchanges as fit HAProxy's line buffer); return the answers."""
        if not commands:
            return ""
        for c in commands:
            if ";" in c or "\n" in c:
                raise RuntimeApiError(f"refusing a command with ';' or a newline: {c!r}")
        answers: list[str] = []
        batch: list[str] = []
        size = 0
        for c in commands:
            if batch and size + len(c) + 2 > MAX_LINE_BYTES:
                answers.append(await self._exchange(batch))
                batch, size = [], 0
            batch.append(c)
            size += len(c) + 2
        answers.append(await self._exchange(batch))
        return "".join(answers)

    async def _exchange(self, commands: Sequence[str]) -> str:
        try:
            async with asyncio.timeout(self.timeout_s):
                reader, writer = await self._open()
                try:
                    writer.write(("; ".join(commands) + "\n").encode())
                    await writer.drain()
                    data = await reader.read()
                finally:
                    writer.close()
                    await writer.wait_closed()
        except (OSError, TimeoutError) as exc:
            why = str(exc) or type(exc).__name__
            raise RuntimeApiError(f"HAProxy runtime API at {self.addr}: {why}") from None
        return data.decode(errors="replace")

    async def show_servers_state(self) -> str:
        return await self.run(["show servers state"])

    async def show_stat(self) -> str:
        return await self.run(["show stat"])
