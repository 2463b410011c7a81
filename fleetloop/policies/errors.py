"""The one error a policy document that cannot take effect raises (a leaf: the CLI names it without
loading the algorithms)."""

from __future__ import annotations


class PolicyError(ValueError):
    """A policy document that cannot take effect. ``str()`` is one line naming the problem."""
