"""The runtime: the only package that does I/O. ``model`` and ``decide`` stay pure (import-linter)."""
