"""The pure core: the fleet model (``model``), the decision engine (``decide``), shards and their
checkpoint codec, and the fleet-wide summary fold. Deterministic functions of event-time input: no
Kafka, no asyncio, no wall clock, no logging (import-linter holds it)."""
