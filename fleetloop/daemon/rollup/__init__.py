"""The fleet-wide second stage: per-shard summaries in, fleet figures out (docs/architecture.md)."""
