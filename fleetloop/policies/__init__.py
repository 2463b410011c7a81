"""The decisions: pure algorithms, one file each, named by section and kebab-case name in one table
(:mod:`fleetloop.policies.builtin`).

Imports :mod:`fleetloop.schemas` only (import-linter). See :mod:`fleetloop.policies.base` for the
contract and :mod:`fleetloop.policies.registry` for compiling a policy document.
"""
