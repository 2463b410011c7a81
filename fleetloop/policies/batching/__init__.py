"""batching algorithms."""
