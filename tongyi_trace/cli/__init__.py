"""The `kvtrace` command: a thin Typer app; each command lives in its own module of this package.

Commands load lazily: `kvtrace --help` lists them from their source (no import), and a command's module,
with the libraries it needs, is imported only when that command runs or shows its own help.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path
from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup

# command -> module of this package that registers it, in the pipeline's order (shown so in --help)
COMMANDS: dict[str, str] = {
    "capture": "capture", "ingest": "ingest", "export": "ingest", "synth": "synth", "analyze": "analyze",
    "report": "report",
    "fit": "fit", "simulate": "simulate", "engine": "engine", "replay": "replay", "compare": "compare",
    "study": "study",
}


class QuickGroup(TyperGroup):
    """A Typer group whose unused --help flag is False, not None: Typer builds a pydantic adapter (~80 ms of
    imports) to coerce a None, so `kvtrace CMD --help` would pay pydantic for the group's own flag."""

    def get_help_option(self, ctx: Any) -> Any:
        """The group's --help option, defaulting to False."""
        opt = super().get_help_option(ctx)
        if opt is not None:
            opt.default = False
        return opt


class LazyGroup(QuickGroup):
    """A Typer group whose commands are imported on first use; its help lists them without importing."""

    _listing = False

    def list_commands(self, ctx: Any) -> list[str]:
        """Every command, in COMMANDS order."""
        return list(COMMANDS)

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        """The command CMD_NAME: a stub carrying its short help while the group's help is listed, else the
        real command (its module imported now)."""
        if cmd_name not in COMMANDS:
            return None
        if cmd_name not in self.commands:
            if self._listing:
                return TyperCommand(cmd_name, help=_short_help(cmd_name))
            self.add_command(_load(cmd_name), cmd_name)
        return self.commands[cmd_name]

    def main(self, *args: Any, **kwargs: Any) -> Any:
        """Click's main, with a mistyped option or value reported as one line (exit 2), not a usage block."""
        import sys

        from typer.core import _click  # the Click that Typer runs (vendored in Typer 0.29)

        exc = _click.exceptions
        try:
            standalone_mode = kwargs.pop("standalone_mode", True)
            kwargs["standalone_mode"] = False
            rv = super().main(*args, **kwargs)
        except exc.NoArgsIsHelpError as e:  # `kvtrace` alone: the help, as before
            e.show()
            sys.exit(e.exit_code)
        except exc.UsageError as e:
            where = e.ctx.command_path if e.ctx is not None else "kvtrace"
            typer.echo(f"error: {e.format_message().rstrip('.')}; see '{where} --help'", err=True)
            sys.exit(e.exit_code)
        except exc.ClickException as e:
            e.show()
            sys.exit(e.exit_code)
        except typer.Abort:
            typer.echo("Aborted.", err=True)
            sys.exit(1)
        if standalone_mode and isinstance(rv, int):  # typer.Exit(code) in non-standalone mode returns its code
            sys.exit(rv)
        return rv

    def format_help(self, ctx: Any, formatter: Any) -> None:
        """The group's help, listing the commands from their source."""
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False


app = typer.Typer(
    name="kvtrace",
    cls=LazyGroup,
    help="KV-cache reuse in LLM serving traces: characterize, fit, simulate, replay on vLLM, report.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,  # plain Click help: rendering Rich panels doubles the start-up of `--help`
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        from tongyi_trace import __version__

        typer.echo(f"kvtrace {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    """KV-cache reuse in LLM serving traces: characterize, fit, simulate, replay on vLLM, report."""


def _load(name: str) -> Any:
    """Import the module registering command NAME on `app` and build its Click command."""
    importlib.import_module(f"tongyi_trace.cli.{COMMANDS[name]}")
    opts: dict[str, Any] = {"pretty_exceptions_short": app.pretty_exceptions_short,
                            "rich_markup_mode": app.rich_markup_mode}
    for info in app.registered_commands:
        cb = info.callback
        if (info.name or (cb.__name__.replace("_", "-") if cb else "")) == name:
            return typer.main.get_command_from_info(info, **opts)
    for group in app.registered_groups:
        if group.name == name:
            return typer.main.get_group_from_info(group, suggest_commands=app.suggest_commands, **opts)
    raise LookupError(f"tongyi_trace.cli.{COMMANDS[name]} does not register command {name}")


def _short_help(name: str) -> str:
    """Command NAME's help as written in its module (the command function's docstring, else the module's
    docstring after its colon), read without importing the module."""
    tree = ast.parse((Path(__file__).parent / f"{COMMANDS[name]}.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return " ".join(inspect.cleandoc(ast.get_docstring(node) or "").split("\n\n")[0].split())
    doc = " ".join((ast.get_docstring(tree) or "").split("\n\n")[0].split()).split(": ", 1)[-1]
    return doc[:1].upper() + doc[1:]


def _assigned(module: str, name: str) -> ast.expr:
    """The expression assigned to NAME at the top of tongyi_trace module MODULE (dotted, e.g. "fit.tune")."""
    path = Path(__file__).parents[1].joinpath(*module.split(".")).with_suffix(".py")
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return node.value
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name \
                and node.value is not None:
            return node.value
    raise LookupError(f"{path}: no top-level assignment to {name}")


def source_value(module: str, name: str) -> Any:
    """The literal NAME = ... of tongyi_trace module MODULE, read from its source without importing it, so an
    option's default or help can name it while `kvtrace CMD --help` stays free of numpy, polars and the like
    (tests/cli/test_startup.py checks every use against the imported value)."""
    return ast.literal_eval(_assigned(module, name))


def source_keys(module: str, name: str) -> list[str]:
    """The names of the registry NAME of tongyi_trace module MODULE, read from its source: the string keys of
    a dict display, else the first string argument of each call in the expression (`Profile("to-c", ...)`)."""
    value = _assigned(module, name)
    if isinstance(value, ast.Dict):
        return [ast.literal_eval(k) for k in value.keys if k is not None]
    return [n.args[0].value for n in ast.walk(value) if isinstance(n, ast.Call) and n.args
            and isinstance(n.args[0], ast.Constant) and isinstance(n.args[0].value, str)]


def load_all() -> None:
    """Import every command module (for tools that inspect `app.registered_commands`)."""
    for module in dict.fromkeys(COMMANDS.values()):
        importlib.import_module(f"tongyi_trace.cli.{module}")
