"""``fleetloop actuate sglang-router``: keep SGLang's router's worker list at fleetloop's desired membership.

``fleetloop actuate sglang-router --url http://127.0.0.1:PORT --worker-map FILE --bootstrap-servers
HOST:PORT [--period-s 0.5] [--fail-static-s 30] [--metrics-url http://127.0.0.1:PORT/metrics
[--metrics-period-s 1] [--model NAME]]``

The same loop as ``fleetloop actuate vllm-router`` (:mod:`fleetloop.edges.actuate.worker_list`) with
SGLang's router's calls: ``GET /workers``, ``POST /workers`` and ``DELETE /workers/{id}``. Both
changes are queued by the router (202) and done in the background, so each call returns once the
router lists the worker (added) or no longer lists it (removed): adds still finish before any
removal starts, and a pass never takes its own removal, still queued, for drift. A worker the
router has not listed within ``SETTLE_S`` of being added (its health check keeps failing) fails the
pass before anything is removed, with the router's own account of the job.

With ``--metrics-url`` (the router's ``--prometheus-host``/``--prometheus-port`` page) it also reads
``smg_worker_cb_outcomes_total{worker,outcome}`` and publishes each worker's calls to
``fleet.requests``, as ``fleetloop actuate vllm-router`` does with vllm-router's counter
(:mod:`fleetloop.edges.actuate.worker_list.outcomes`). SGLang's router counts any answer that is not
2xx as a failure, a caller's 400 and a worker's 429 too.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from fleetloop.edges.actuate.worker_list import actuator as worker_list
from fleetloop.edges.actuate.worker_list.actuator import HttpApi, WorkerListActuator, WorkerListError
from fleetloop.edges.actuate.worker_list.outcomes import SGLANG_ROUTER
from fleetloop.router import clock

SETTLE_S = 30.0  # how long an added (removed) worker may take to appear in (leave) the router's list
POLL_S = 0.1


class SglangRouterApi(HttpApi):
    router = "sglang-router"

    def __init__(self, base_url: str, timeout_s: float = 30.0, settle_s: float = SETTLE_S) -> None:
        super().__init__(base_url, timeout_s)
        self.settle_s = settle_s
        self._ids: dict[str, str] = {}  # worker URL -> the router's worker id, from its last list

    async def _listed(self) -> dict[str, str]:
        body = (await self._call("GET", "/workers")).json()
        try:
            ids = {str(w["url"]): str(w["id"]) for w in body["workers"]}
        except (KeyError, TypeError) as exc:
            got = str(body)[:200]
            raise WorkerListError(f"sglang-router GET /workers: no worker list in {got} ({exc})") from None
        self._ids = ids
        return ids

    async def list_workers(self) -> set[str]:
        return set(await self._listed())

    async def add_worker(self, url: str) -> None:
        r = (await self._call("POST", "/workers", json={"url": url})).json()
        await self._settle(url, listed=True, job=str(r.get("worker_id", "")))

    async def remove_worker(self, url: str) -> None:
        wid = self._ids.get(url) or (await self._listed()).get(url)
        if wid is None:
            return  # already gone
        await self._call("DELETE", f"/workers/{wid}")
        await self._settle(url, listed=False, job=wid)

    async def _settle(self, url: str, *, listed: bool, job: str) -> None:
        """Return once ``url`` is (``listed``) or is not in the router's list; the router's account of
        the job in a :class:`WorkerListError` when it takes longer than ``settle_s``."""
        deadline = clock.monotonic_s() + self.settle_s
        while True:
            if (url in await self._listed()) == listed:
                return
            if clock.monotonic_s() >= deadline:
                break
            await asyncio.sleep(POLL_S)
        status = ""
        if job:
            try:
                status = str((await self._call("GET", f"/workers/{job}")).json().get("job_status", ""))[:300]
            except WorkerListError as exc:
                status = str(exc)
        what = "not listed" if listed else "still listed"
        done = "added" if listed else "removed"
        status = status or "no job status"
        after = f"{self.settle_s:g} s after it was {done}"
        raise WorkerListError(f"sglang-router: {url} {what} {after} ({status})")


class SglangRouterActuator(WorkerListActuator):
    log = logging.getLogger("fleetloop.actuate.sglang_router")


def register(act_sub: Any) -> None:
    """``sglang-router`` under ``fleetloop actuate`` (the group: :mod:`fleetloop.edges.actuate.command`)."""
    worker_list.register(act_sub, "sglang-router", SglangRouterApi, SglangRouterActuator, SGLANG_ROUTER)
