"""fleetloop: a streaming control plane for LLM inference fleets, on Kafka.

Packages, in layer order (import-linter enforces it, see ``.importlinter``):

- :mod:`fleetloop.schemas`  the vocabulary: wire models, topic registry, JSON Schema export. No I/O.
- :mod:`fleetloop.policies` the decisions: pure algorithms, one file each, and policy documents.
- :mod:`fleetloop.daemon`   the runtime, the only package with I/O; ``model`` and ``decide`` stay pure.
- :mod:`fleetloop.sim`      the fleet simulator; drives the same model and decide code in process.
"""

__version__ = "0.1.0"
