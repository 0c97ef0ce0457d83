"""`python -m tongyi_trace.cli` runs the kvtrace command."""

from tongyi_trace.cli import app

app()
