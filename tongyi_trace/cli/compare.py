"""`kvtrace compare` (being written)."""
