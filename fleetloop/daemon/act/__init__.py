"""ACT: publish desired state and the decision log; route dead letters."""

from fleetloop.daemon.act.publish import Publisher, decision_bytes

__all__ = ["Publisher", "decision_bytes"]
