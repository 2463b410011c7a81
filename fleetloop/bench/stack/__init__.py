"""``fleetloop bench stack``: one emulated fleet and agent workload behind the routers people run,
alone and driven by fleetloop, head to head.

::

    fleetloop bench stack --scenario FILE [--seconds N] [--drain-s N] [--arms A,B,...] [--runs 3]
                          [--agent-procs 2] [--max-lag-ms 20] [--void-retries 2] [--out DIR] [--json]

Per run of an arm (:mod:`.run`): the scenario's nodes (:class:`LiveFleet`, real HTTP servers on
loopback running the simulator's node physics, with cold starts) in this process; the arm's router
as a real process (:mod:`.arms`: one line an arm); a fleetloop daemon on the embedded Tansu broker
with ``fleetloop scrape`` of the nodes' vLLM ``/metrics``, whose autoscale targets the fleet's
worker manager obeys (peers: KEDA on queue and KV, the ``modern`` baseline; fleetloop arms: the
shipped default policy, which also drives the router through its ``fleetloop actuate``); the agents
(the ``openai`` SDK) split over a few processes (:mod:`.agents_proc`), every call to the one router
URL. Runs are interleaved and repeated (:mod:`.command`); figures are client side and per arm the
median of the valid runs with min and max (:mod:`.report`): task success, priority-0 success, cost
per successful task (every node billed from provisioning to removal, as the simulator bills),
TTFT p50/p99, node-hours and peak nodes, with the emulator's and the agents' lag, so a machine too
slow to emulate the fleet cannot pass for a good policy. Output: ``<scenario>.md`` / ``.json`` and
``<scenario>.png`` (timelines of tasks ok, TTFT p50 and nodes, every arm overlaid) under ``--out``
(default ``bench/results/stack``). Exit 1 when an arm finished no task successfully in any run.
"""

from fleetloop.bench.stack.command import register

__all__ = ["register"]
