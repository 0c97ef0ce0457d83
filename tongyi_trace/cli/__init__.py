"""The `kvtrace` command: a thin Typer app; each command lives in its own module of this package."""

from __future__ import annotations

import typer

from tongyi_trace import __version__

app = typer.Typer(
    name="kvtrace",
    help="KV-cache reuse in LLM serving traces: characterize, fit, simulate, replay on vLLM, report.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"kvtrace {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    """KV-cache reuse in LLM serving traces: characterize, fit, simulate, replay on vLLM, report."""


# Each module registers its command(s) on `app`, in the pipeline's order (shown so in --help).
# isort: off
from tongyi_trace.cli import ingest as _ingest  # noqa: E402,F401
from tongyi_trace.cli import synth as _synth  # noqa: E402,F401
from tongyi_trace.cli import analyze as _analyze  # noqa: E402,F401
from tongyi_trace.cli import report as _report  # noqa: E402,F401
from tongyi_trace.cli import fit as _fit  # noqa: E402,F401
from tongyi_trace.cli import simulate as _simulate  # noqa: E402,F401
from tongyi_trace.cli import engine as _engine  # noqa: E402,F401
from tongyi_trace.cli import replay as _replay  # noqa: E402,F401
from tongyi_trace.cli import compare as _compare  # noqa: E402,F401
from tongyi_trace.cli import study as _study  # noqa: E402,F401
# isort: on
