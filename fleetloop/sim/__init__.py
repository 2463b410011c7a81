"""SIM: the fleet simulator (serving nodes, routers, GPU workers, agent clients, faults, accounting).

It drives the daemon's own MODEL and DECIDE code in process, in virtual time (``fleetloop sim``),
and its time-agnostic core (:class:`fleetloop.sim.fleet.FleetSim`) also feeds the live demo.
"""
