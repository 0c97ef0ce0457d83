"""`kvtrace fit` on the command line: table, --json, errors as one line with an exit code."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from typer.testing import CliRunner

from tongyi_trace.budget import default_limit_gib
from tongyi_trace.cli import app
from tongyi_trace.policy.file import load_policy

runner = CliRunner()


def two_conversations() -> list[tuple[float, str | None, int | None, list[int]]]:
    return [(0.0, "text", 1, [1]), (4.0, "text", 2, [1, 2]), (2.0, "file", 1, [7]), (9.0, "file", 2, [7, 8])]


def test_json_output_and_policy(make_run: Callable[..., Path], tmp_path: Path) -> None:
    run = make_run(two_conversations())
    res = runner.invoke(app, ["fit", str(run), "-o", str(tmp_path / "p.json"), "--min-samples", "1",
                              "--train", "0:5", "--test", "5:", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["policy"] == str(tmp_path / "p.json")
    assert doc["train"] == {"start_s": 0.0, "end_s": 5.0} and doc["test"] == {"start_s": 5.0, "end_s": 9.0}
    rows = {r["category"]: r for r in doc["rows"]}
    assert rows["text-1"]["train_num_observed"] == 1 and rows["text-1"]["mean_reuse_s"] == 4.0
    assert rows["file-2"]["test_num_samples"] == 2  # only in the test window
    assert load_policy(tmp_path / "p.json").categories["text-1"].rate_per_s == 0.25


def test_table_and_default_output(make_run: Callable[..., Path]) -> None:
    run = make_run(two_conversations())
    res = runner.invoke(app, ["fit", str(run), "--min-samples", "1", "--test", "5:"])
    assert res.exit_code == 0, res.output
    assert "held-out window" not in res.output and "categories fitted (tables: --verbose" in res.output
    res = runner.invoke(app, ["fit", str(run), "--min-samples", "1", "--test", "5:", "--verbose"])
    assert res.exit_code == 0, res.output
    assert "text-1" in res.output and "held-out window" in res.output
    assert (run / "fit" / "policy.json").is_file()  # no -o: the policy lands in RUN_DIR/fit/
    quiet = runner.invoke(app, ["fit", str(run), "-q"])
    assert quiet.exit_code == 0 and quiet.output == ""


def test_errors_are_one_line(make_run: Callable[..., Path], tmp_path: Path) -> None:
    run = make_run(two_conversations())
    res = runner.invoke(app, ["fit", str(run), "--train", "7:3"])
    assert res.exit_code == 2
    assert res.output.strip().count("\n") == 0 and "--train '7:3'" in res.output
    res = runner.invoke(app, ["fit", str(tmp_path / "nothing")])
    assert res.exit_code == 2 and "not a kvtrace run folder" in res.output


def test_choice_per_capacity_is_printed(make_run: Callable[..., Path], tmp_path: Path) -> None:
    """The answer (what to run at each capacity) is on the terminal and in --json, as in the policy file:
    at 4 blocks everything fits, every candidate hits the 2 reuses of 6 refs and LRU stays: the answer comes
    first, in words."""
    run = make_run(two_conversations())
    args = ["fit", str(run), "-o", str(tmp_path / "p.json"), "--min-samples", "1", "--holdout", "0",
            "-c", "4", "--train", "0:5", "--test", "0:"]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "setting to run per capacity (chosen by simulation on the train window" in res.output
    row = next(line for line in res.output.splitlines() if line.startswith("│ 4 "))
    assert [c.strip() for c in row.strip("│").split("│")] == [
        "4", "4", "lru", "0.2500", "0.2500", "+0.00 +- 0.00", "+0.00 (lru)", "0.3333", "+0.00 +- 0.00"]
    # the answer first, in the Recommendation's words (sim/recommend.py answer_line), sized for the model
    first, answer = res.output.splitlines()[:2]
    assert first == "Recommendation" and answer.startswith("  At 4 (4 blocks = ")
    assert answer.endswith(" HBM) run LRU (the fitted choice): no policy beats it here (best: fifo +0.00 +- 0.00 "
                           "points).")
    assert len(res.output.splitlines()) <= 25
    verbose = runner.invoke(app, [*args, "--verbose"])
    assert "no candidate beats LRU (best: fifo +0.00 +- 0.00 points)" in verbose.output  # the why column
    doc = json.loads(runner.invoke(app, [*args, "--json"]).stdout)
    choices = load_policy(tmp_path / "p.json").choices
    assert [(c["capacity_blocks"], c["policy"]) for c in doc["choices"]] == [(4, "lru")]
    assert doc["choices"][0]["train"]["hit_ratio"] == choices[0].train["hit_ratio"] == 0.25
    # the plan of the capacity-aware step (sim/streamed.py plan_fit): 6 references fit any budget
    assert doc["memory"] == {"limit_gib": default_limit_gib(), "streamed": False, "jobs": 0, "notes": []}


def test_unclear_messages_say_what_to_do(make_run: Callable[..., Path], tmp_path: Path) -> None:
    """Issue 42: `--test 100000:` names the trace's length (it said only "need 0 <= START < END"); `-o file/x.json`
    names the file in the way (it said "(File exists)"). Neither leaves a policy or a staged set behind."""
    run = make_run(two_conversations())
    res = runner.invoke(app, ["fit", str(run), "--test", "100000:"])
    assert res.exit_code == 2, res.output
    msg = " ".join(res.output.split())
    assert "--test 100000:: starts past the trace's end (the trace spans 0:9 s from its first request); give " \
        "--test a window inside the trace" in msg
    blocker = tmp_path / "file"
    blocker.write_text("mine")
    res = runner.invoke(app, ["fit", str(run), "--min-samples", "1", "-o", str(blocker / "x.json")])
    assert res.exit_code == 2, res.output
    assert f"{blocker / 'x.json'}: {blocker} is a file, not a folder" in " ".join(res.output.split())
    assert blocker.read_text() == "mine" and not (run / "fit").exists()
    assert not [p.name for p in run.iterdir() if p.name.startswith(".staging.")]
