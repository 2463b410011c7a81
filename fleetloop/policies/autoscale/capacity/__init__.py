"""capacity: pools sized by the serving physics (README.md beside this file)."""

from fleetloop.policies.autoscale.capacity.params import CapacityParams, PoolSpec
from fleetloop.policies.autoscale.capacity.rule import Capacity
from fleetloop.policies.autoscale.capacity.state import Burst, CapacityState, Episode

__all__ = ["Burst", "Capacity", "CapacityParams", "CapacityState", "Episode", "PoolSpec"]
