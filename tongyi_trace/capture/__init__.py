"""`kvtrace capture`: record a privacy-safe Qwen-Bailian trace of live traffic through a reverse proxy.

proxy.py (the proxy), relay.py (its forwarding path), handoff.py (each finished request handed to the
recorder process), recorder.py (the recorder: a request's line), blocks.py (keyed chained block hashes, dense
ids), content.py (request types), writer.py (the line writer), tokenize.py (a prompt's token ids). A driver
like replay/: it imports trace/, errors and the utilities, never cli/.
"""
