"""One eviction policy per file; each opens with its algorithm in pseudo-code, its definition and source."""
