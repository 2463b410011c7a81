"""OBSERVE: read Kafka in batches, decode and validate, dead-letter what cannot be read."""

from fleetloop.daemon.observe.decode import DeadLetter, Decoded, decode_batch

__all__ = ["DeadLetter", "Decoded", "decode_batch"]
