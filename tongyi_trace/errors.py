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


def brief(text: str, width: int = 120) -> str:
    """TEXT on one line for a message, at most about WIDTH characters: whitespace collapsed and, when longer,
    cut after its last whole word or item with " ..." (never mid-word: "...'output_len" read as a typo)."""
    one = " ".join(str(text).split())
    if len(one) <= width:
        return one
    cut = max(one.rfind(",", 0, width - 4), one.rfind(" ", 0, width - 4))
    return (one[:cut] if cut > 0 else one[:width - 4]).rstrip(", ") + " ..."
