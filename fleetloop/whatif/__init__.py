"""``fleetloop whatif``: a recorded incident as a scenario, simulated under the recorded policy and a
candidate side by side. :mod:`.derive` is pure (decoded records in, scenario and observed KPIs out);
:mod:`.command` reads the broker and runs the simulator."""
