"""``fleetloop fleet``: the emulated fleet (see :mod:`fleetloop.edges.fleet.live` for the Python API)."""
