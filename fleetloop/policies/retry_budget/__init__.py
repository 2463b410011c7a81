"""retry budget algorithms."""
