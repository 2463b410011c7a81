"""Edges: the translators between fleetloop's wire contract and a real fleet.

- :mod:`fleetloop.edges.scrape`: serving runtimes' Prometheus endpoints (vLLM, SGLang, TensorRT-LLM,
  Dynamo) -> ``NodeTelemetry`` on ``fleet.telemetry``;
- :mod:`fleetloop.edges.fleet`: the emulated fleet, the simulator's node model behind real sockets
  (OpenAI API, vLLM's ``/metrics``), its worker manager and its agent clients;
- :mod:`fleetloop.edges.actuate`: ``control.state`` -> real routers (HAProxy's runtime API), and
  their logs -> ``RequestOutcome`` on ``fleet.requests``.

Edges translate; they hold no judgement (that is the policies' job) and import the schemas, never
the policies or the daemon's core (import-linter contract ``edges-translate-only``).
"""
