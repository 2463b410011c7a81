"""routing algorithms."""
