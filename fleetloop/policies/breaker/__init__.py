"""breaker algorithms."""
