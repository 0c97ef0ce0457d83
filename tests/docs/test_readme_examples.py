"""Every `kvtrace ...` command the README and docs/*.md show names a real command and only its real options."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import typer

from tongyi_trace.cli import app

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = re.compile(r"`kvtrace(?! \w+:)( [^`]*)?`")  # not a log line ("kvtrace guard: switch to lru ...")
CODE_LINE = re.compile(r"^\s*kvtrace( .*)$", re.M)  # a command line in a fenced block (# comments, \ and && too)


def examples(text: str) -> list[str]:
    """The kvtrace command lines of TEXT, each without "kvtrace": inline `kvtrace ...` and code lines."""
    out = [m.group(1) or "" for m in EXAMPLE.finditer(text)]
    for m in CODE_LINE.finditer(text.replace("\\\n", " ")):
        out += [part.split(" #", 1)[0].strip().removeprefix("kvtrace") for part in m.group(1).split("&&")]
    return [" ".join(e.split()) for e in out]


def _options(cmd: Any) -> set[str]:
    return {"--help"} | {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)}


def stale_examples(text: str) -> list[str]:
    """The inline `kvtrace ...` commands of TEXT whose command does not exist or that give an option the
    command does not have ("kvtrace engine install|start" names several subcommands, each checked; what
    follows a command that is not a group is its arguments and options). Duck-typed: Typer runs its own
    copy of Click."""
    root = typer.main.get_command(app)
    bad = []
    for example in examples(text):
        words = shlex.split(example.replace("\\|", "|"))
        cmds: list[Any] = [root]
        while words and not words[0].startswith("-") and hasattr(cmds[0], "get_command"):
            names = words.pop(0).split("|")
            ctx = cmds[0].context_class(cmds[0])
            found = [cmds[0].get_command(ctx, n) for n in names]
            if any(c is None for c in found):  # a command or a group's subcommand that does not exist
                bad.append(f"kvtrace {example}".rstrip())
                cmds = []
                break
            cmds = [c for c in found if c is not None]
        flags = {w.split("=", 1)[0] for w in words if w.startswith("-") and not re.fullmatch(r"-\d.*", w)}
        if any(flags - _options(c) for c in cmds):
            bad.append(f"kvtrace {example}".rstrip())
    return bad


def test_readme_and_docs_examples_are_real_commands() -> None:
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:  # docs/cli.md: test_cli_docs
        text = doc.read_text(encoding="utf-8")
        if doc.name == "README.md":
            assert len(examples(text)) >= 40  # the README's command table and walk-through
        assert stale_examples(text) == [], doc.name


def test_a_wrong_example_is_caught() -> None:
    assert stale_examples("`kvtrace simulate runs/toc -p lru -c 5% --instances 2,4`") == []
    assert stale_examples("`kvtrace engine install\\|start\\|stop\\|status` and `kvtrace --help`") == []
    assert stale_examples("logged as `kvtrace guard: switch to lru at 12 s`") == []
    for wrong in ("kvtrace simulate runs/toc --capacities 5%", "kvtrace simulat runs/toc",
                  "kvtrace engine start --num-block 512", "kvtrace engine install\\|strat"):
        assert stale_examples(f"`{wrong}`") == [wrong]


def test_code_lines_are_checked_too() -> None:
    block = ("```bash\nkvtrace engine start --name a --num-blocks 300     # prints http://127.0.0.1:PORT_A\n"
             "kvtrace replay runs/toc --server URL \\\n    --router prefix\n"
             "kvtrace engine stop --name a && kvtrace engine stop --nam b\n```\n")
    assert stale_examples(block) == ["kvtrace engine stop --nam b"]
    assert stale_examples(block.replace("--router", "--routr")) == [
        "kvtrace replay runs/toc --server URL --routr prefix", "kvtrace engine stop --nam b"]
