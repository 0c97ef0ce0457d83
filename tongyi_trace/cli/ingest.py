"""`kvtrace ingest` (being written)."""
