"""`kvtrace report` (being written)."""
