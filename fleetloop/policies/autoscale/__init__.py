"""autoscale algorithms."""
