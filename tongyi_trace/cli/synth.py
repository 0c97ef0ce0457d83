"""`kvtrace synth` (being written)."""
