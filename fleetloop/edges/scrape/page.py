"""A metrics page read over HTTP with its size capped as it is read.

A page larger than the cap is refused after at most the cap's bytes (at once when its
``Content-Length`` says so), never buffered whole: a hostile or broken endpoint cannot make the
reader hold an unbounded body. ``fleetloop scrape`` and the router outcome reporter
(:mod:`fleetloop.edges.actuate.worker_list.report`) read their pages through :func:`read_page`.
Each opens its own stream: they part on an error status, which ``fleetloop scrape`` refuses before
reading the body (a failed target, the body unread) and the reporter only after reading it, capped,
to quote its start in the error.
"""

from __future__ import annotations

import httpx

MAX_PAGE_BYTES = 16 * 2**20  # the readers' cap: a /metrics page larger than this is refused, not parsed


class PageTooLarge(Exception):
    """The page is larger than the cap (one line)."""


async def read_page(response: httpx.Response, max_bytes: int) -> str:
    """The body of ``response`` (opened with ``client.stream``, not yet read) as text, decoded as
    httpx's ``Response.text`` does; :class:`PageTooLarge` when it declares more than ``max_bytes``
    or, read in chunks, passes ``max_bytes`` (decoded bytes, as ``len(response.content)`` counts
    them). httpx's errors while reading propagate."""
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise PageTooLarge(f"a page over {max_bytes} bytes (Content-Length {declared})")
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > max_bytes:
            raise PageTooLarge(f"a page over {max_bytes} bytes")
        chunks.append(chunk)
    return b"".join(chunks).decode(response.encoding or "utf-8", errors="replace")
