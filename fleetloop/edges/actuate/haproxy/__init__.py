"""``fleetloop actuate haproxy``: control.state -> HAProxy's runtime API; HAProxy's log -> fleet.requests.

- :mod:`.mapping` (pure): desired state + backend map -> per-server targets (state, weight, maxconn),
  and the commands that move HAProxy's observed state to them.
- :mod:`.runtime_api`: the runtime API client (unix socket or TCP on loopback).
- :mod:`.logs`: HAProxy's log lines (syslog over UDP) -> RequestOutcome.
- :mod:`.actuator`: the loop; :mod:`.command`: the CLI.
"""
