"""`kvtrace engine` (being written)."""
