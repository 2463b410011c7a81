"""Actuators: desired state from ``control.state`` applied to targets fleetloop does not own.

Each actuator only translates: all judgement stays in the policies. What a target cannot express
is listed in its table in docs/integrations/routers.md, never faked; every actuator re-asserts the
desired state when the target drifts, and says so.
"""
