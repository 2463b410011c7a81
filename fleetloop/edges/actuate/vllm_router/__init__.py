"""``fleetloop actuate vllm-router``: control.state -> vllm-router's worker-management API.

vllm-router (PyPI ``vllm-router``, a Rust router) keeps a worker list per router process and exposes
``POST /add_worker?url=``, ``POST /remove_worker?url=`` and ``GET /list_workers`` (read from its
0.1.17 build: ``src/server.rs`` routes in the wheel's binary, exercised by the integration test).
It has no weights, so fleetloop can only decide membership: the worker-list actuators' mapping
(:mod:`fleetloop.edges.actuate.worker_list.mapping`) says which workers should be in, :mod:`.command`
applies it with vllm-router's calls and re-asserts it on drift.
"""
