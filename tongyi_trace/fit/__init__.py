"""Per-category reuse-time models and the versioned policy file (kvtrace.policy/1)."""
