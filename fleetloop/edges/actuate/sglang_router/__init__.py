"""``fleetloop actuate sglang-router``: control.state -> SGLang's router's worker API.

SGLang's router (PyPI ``sglang-router``, the SGLang Model Gateway, a Rust binary in the wheel) keeps
a worker registry per router process: ``GET /workers`` lists it (each worker's ``id``, ``url``,
``is_healthy``), ``POST /workers`` with ``{"url": ...}`` queues an addition (202; the router checks
the worker's health in the background and lists it once it passes), ``DELETE /workers/{id}`` queues
a removal (202). Read from its 0.3.2 build and exercised by the integration test. 0.3.2 has no call
that changes a listed worker's share (``PATCH /workers/{id}`` answers 405), so, as with vllm-router,
fleetloop decides membership only: the worker-list actuators' mapping
(:mod:`fleetloop.edges.actuate.worker_list.mapping`) says which workers should be in,
:mod:`.command` applies it with these calls and re-asserts it on drift.
"""
