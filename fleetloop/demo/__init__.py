"""``fleetloop demo``: the closed loop end to end (a broker, the daemon, a simulated fleet), in one
process or (``--wire``) as separate processes."""
