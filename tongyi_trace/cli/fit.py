"""`kvtrace fit` (being written)."""
