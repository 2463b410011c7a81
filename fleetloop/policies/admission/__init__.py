"""admission algorithms."""
