"""MODEL: fold telemetry and request outcomes into a live model of the fleet (pure reducer)."""

from fleetloop.core.model.fleet import FleetModel, ModelConfig, apply, snapshot

__all__ = ["FleetModel", "ModelConfig", "apply", "snapshot"]
