"""The serving performance model: GPUs and models (:mod:`.catalog`), serving-engine profiles
(:mod:`.engines`), the time of one iteration (:mod:`.step`) and a node's steady state under load
(:mod:`.serving`). Pure data and arithmetic, no I/O: the simulator runs it, and the capacity
autoscaler plans with the same functions (one implementation of the physics)."""
