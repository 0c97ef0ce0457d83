"""`kvtrace analyze` (being written)."""
