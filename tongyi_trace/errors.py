"""The small family of errors kvtrace raises; the CLI maps each to an exit code and one line."""

from __future__ import annotations


class KvtraceError(Exception):
    """Base class: the message is one line a user can act on."""

    exit_code = 1


class InputError(KvtraceError):
    """A trace, run folder or parameter file is malformed (the message names file:line and field)."""

    exit_code = 2


class UsageError(KvtraceError):
    """Options that do not fit together or a value out of range."""

    exit_code = 2


class EngineError(KvtraceError):
    """The vLLM engine could not be installed, started or reached."""

    exit_code = 3


def located(path: object, line: int | None, field: str | None, what: str, fix: str) -> InputError:
    """Build an InputError whose message reads `path:line: field 'x': what; fix`."""
    where = f"{path}:{line}" if line is not None else f"{path}"
    fld = f" field '{field}'" if field else ""
    return InputError(f"{where}:{fld} {what}; {fix}".replace(": ;", ":"))


class ClusterError(KvtraceError):
    """The Ray cluster could not be reached or was lost (finished results are kept on disk)."""

    exit_code = 4
