"""``fleetloop actuate vllm-router``: keep a vllm-router's worker list at fleetloop's desired membership.

``fleetloop actuate vllm-router --url http://127.0.0.1:PORT --worker-map FILE --bootstrap-servers
HOST:PORT [--period-s 0.5] [--fail-static-s 30] [--metrics-url http://127.0.0.1:PORT/metrics
[--metrics-period-s 1] [--model NAME]]``

It follows ``control.state``; every period (and at once when new state arrives) it reads
``GET /list_workers``, adds the workers that should be in (``POST /add_worker?url=``, which makes
vllm-router wait for the worker's health check) before removing the ones that should not
(``POST /remove_worker?url=``), so the list never empties on the way. A difference on a worker whose
target did not change since it was last asserted is drift (someone's manual change, a restart of
the router): re-asserted and logged as ``drift``. Workers vllm-router lists that the map does not
know are left alone. The loop and the mapping are the worker-list actuators' own
(:mod:`fleetloop.edges.actuate.worker_list`); this module is vllm-router's HTTP calls.

With ``--metrics-url`` (vllm-router's ``--prometheus-host``/``--prometheus-port`` page) it also reads
``vllm_router_cb_outcomes_total{worker,outcome}`` every ``--metrics-period-s`` and publishes each
worker's calls since the last read to ``fleet.requests`` (``success`` -> ``ok``, ``failure`` ->
``error``, on the worker map's node): vllm-router reports no call to fleetloop otherwise
(:mod:`fleetloop.edges.actuate.worker_list.outcomes`; ``--model`` names the model in each record).
A page that does not answer, or is not vllm-router's, at start is one line and exit code 2.
"""

from __future__ import annotations

import logging
from typing import Any

from fleetloop.edges.actuate.worker_list import actuator as worker_list
from fleetloop.edges.actuate.worker_list.actuator import HttpApi, WorkerListActuator
from fleetloop.edges.actuate.worker_list.outcomes import VLLM_ROUTER


class VllmRouterApi(HttpApi):
    router = "vllm-router"

    async def list_workers(self) -> set[str]:
        body = (await self._call("GET", "/list_workers")).json()
        return {str(u) for u in body.get("urls", [])}

    async def add_worker(self, url: str) -> None:
        await self._call("POST", "/add_worker", params={"url": url})

    async def remove_worker(self, url: str) -> None:
        await self._call("POST", "/remove_worker", params={"url": url})


class VllmRouterActuator(WorkerListActuator):
    log = logging.getLogger("fleetloop.actuate.vllm_router")


def register(act_sub: Any) -> None:
    """``vllm-router`` under ``fleetloop actuate`` (the group: :mod:`fleetloop.edges.actuate.command`)."""
    worker_list.register(act_sub, "vllm-router", VllmRouterApi, VllmRouterActuator, VLLM_ROUTER)
