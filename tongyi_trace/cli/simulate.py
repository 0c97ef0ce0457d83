"""`kvtrace simulate` (being written)."""
