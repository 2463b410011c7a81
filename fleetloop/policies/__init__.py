"""The decisions: pure algorithms, one file each, registered by section and kebab-case name.

Imports :mod:`fleetloop.schemas` only (import-linter). See :mod:`fleetloop.policies.base` for the
contract and :mod:`fleetloop.policies.registry` for compiling a policy document.
"""
