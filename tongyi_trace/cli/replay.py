"""`kvtrace replay` (being written)."""
