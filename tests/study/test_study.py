"""`kvtrace study` over three tiny synthetic windows, through the real Ray cluster; the CLI's user errors."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from html import escape as html_escape
from html.parser import HTMLParser
from pathlib import Path

import polars as pl
import pytest

from tongyi_trace.executor import ExecutorOptions
from tongyi_trace.run import open_run
from tongyi_trace.sim.sweep import SimulateOptions, build_config, run_sweep
from tongyi_trace.study import StudyOptions, find_traces, run_study


@pytest.fixture(scope="module")
def windows(tmp_path_factory: pytest.TempPathFactory, make_trace: Callable[..., Path]) -> Path:
    """Three 250-request to-C windows, named in time order."""
    folder = tmp_path_factory.mktemp("windows")
    for seed, name in ((11, "day1-00"), (12, "day1-02"), (13, "day1-04")):
        make_trace(folder, seed, num_requests=250, duration_s=300).rename(folder / f"{name}.jsonl")
    return folder


def test_study_on_ray(windows: Path, ray_address: str, tmp_path: Path) -> None:
    out = tmp_path / "study"
    res = run_study(str(windows), out, StudyOptions(capacities="10%,1L",
                                                    executor=ExecutorOptions("ray", ray_address)))
    assert res.summary["num_failed"] == 0 and res.summary["executor"] == "ray"
    win = pl.read_parquet(out / "windows.parquet")
    assert win["window"].to_list() == ["day1-00", "day1-02", "day1-04"]
    assert win["num_requests"].to_list() == [250, 250, 250]
    assert all(0 < x < 1 for x in win["ideal_hit_ratio"].to_list())
    fits = pl.read_parquet(out / "fits.parquet")
    assert set(fits["window"]) == set(win["window"])
    assert fits["reuse_prob"].is_between(0, 1).all() and (fits["mean_reuse_s"] > 0).all()
    tr = pl.read_parquet(out / "transfer.parquet")
    # LRU and WA (own fit) on every window, WA with the previous window's fit on all but the first
    assert tr.group_by("policy").len().sort("policy").rows() == [("lru", 6), ("wa-own", 6), ("wa-prev", 4)]
    prev = tr.filter(pl.col("policy") == "wa-prev").sort("window", "capacity")
    assert prev["fitted_on"].to_list() == ["day1-00", "day1-00", "day1-02", "day1-02"]
    # cross-check: the same simulation run directly on day1-02 with day1-00's policy file
    run = out / "runs" / "day1-02"
    cfg = build_config(SimulateOptions(policies="wa", capacities="10%,1L",
                                       params_path=out / "runs" / "day1-00" / "fit" / "policy.json", jobs=1))
    direct = run_sweep(open_run(run), replace(cfg, write=False))
    got = dict(prev.filter(pl.col("window") == "day1-02").select("capacity", "hit_ratio").rows())
    assert got == {r["capacity"]: r["hit_ratio"] for r in direct.rows}
    assert all(0 < h < 1 for h in got.values())
    for w in win["window"]:
        assert (out / "runs" / w / "fit" / "policy.json").is_file()
        assert (out / "runs" / w / "report.html").is_file()
    page = (out / "index.html").read_text()
    assert "day1-04" in page and "Plotly" in page and "previous window" in page
    # styled like the report: its stylesheet and table class, plotly_white, axis titles, counted right
    assert ".kv-table" in page and 'class="kv-table"' in page and "reuse probability p" in page
    assert "(mean of 2 windows)" in page and "(mean of 1 windows)" not in page
    assert set(res.summary["transfer_gain"]) == {"10%", "1L"}


def test_find_traces_orders_by_name_and_rejects_empty(windows: Path, tmp_path: Path) -> None:
    assert [p.name for p in find_traces(str(windows / "*.jsonl"))] == ["day1-00.jsonl", "day1-02.jsonl",
                                                                        "day1-04.jsonl"]
    proc = subprocess.run([sys.executable, "-m", "tongyi_trace.cli", "study", str(tmp_path / "none-*.jsonl"),
                           "-o", str(tmp_path / "o")], capture_output=True, text=True, check=False)
    assert proc.returncode == 2
    assert "no file matches" in proc.stderr and "Traceback" not in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "tongyi_trace.cli", "study", str(windows), "-o",
                           str(tmp_path / "o"), "--executor", "spark"], capture_output=True, text=True, check=False)
    assert proc.returncode == 2 and "--executor 'spark'" in proc.stderr


def test_out_must_be_a_folder_of_its_own(windows: Path, tmp_path: Path) -> None:
    """-o a run folder (or inside one), or a file: refused in one line before anything is written."""
    from tongyi_trace.errors import UsageError
    from tongyi_trace.trace.ingest import ingest_trace

    run = tmp_path / "run"
    ingest_trace(windows / "day1-00.jsonl", run)
    before = sorted(p.name for p in run.iterdir())
    for out, needle in ((run, "is a run folder"), (run / "sim", f"is inside the run folder {run}"),
                        (windows / "day1-00.jsonl", "exists and is not a folder")):
        with pytest.raises(UsageError, match=needle):
            run_study(str(windows), out)
    assert sorted(p.name for p in run.iterdir()) == before


def test_a_study_folder_given_as_a_run_says_so(tmp_path: Path) -> None:
    from tongyi_trace.errors import InputError

    (tmp_path / "study.json").write_text("{}")
    with pytest.raises(InputError, match=r"is a study folder, not a run folder \(its report is .*index.html\); "
                       r"give one of its runs, .*runs/NAME"):
        open_run(tmp_path)


def test_failed_tasks_are_one_plain_line(tmp_path: Path, make_trace: Callable[..., Path]) -> None:
    """A window too small for the study's capacities fails its task; the CLI says so in one line, exit 1."""
    folder = tmp_path / "tiny"
    folder.mkdir()
    make_trace(folder, 3, num_requests=2, duration_s=10).rename(folder / "w.jsonl")
    proc = subprocess.run([sys.executable, "-m", "tongyi_trace.cli", "study", str(folder), "-o", str(tmp_path / "o"),
                           "-q", "-j", "1"], capture_output=True, text=True, check=False)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1 and "[bold" not in proc.stderr, \
        proc.stderr
    assert "task(s) failed (see" in proc.stderr


def test_the_index_page_escapes_hostile_window_names(tmp_path: Path) -> None:
    """A trace named like markup shows as text on index.html: in the table, the report link and the figures."""
    from tongyi_trace.study import StudyResult, write_page

    evil = 'x"><img src=x onerror=alert(document.domain)>'
    report = tmp_path / "runs" / evil / "report.html"
    res = StudyResult(windows=[{"window": evil, "num_requests": 3, "ideal_hit_ratio": 0.5, "report": str(report)}],
                      fits=[{"window": evil, "category": "<b>c</b>", "reuse_prob": 0.5, "mean_reuse_s": 1.0,
                             "life_s": 2.0}],
                      transfer=[], summary={"transfer_gain": {}}, out_dir=tmp_path)
    write_page(res, tmp_path / "index.html")
    page = (tmp_path / "index.html").read_text()
    assert "<img src=x" not in page and "<b>c</b>" not in page  # before: the report link's href broke out
    assert 'href="runs/x%22%3E%3Cimg%20src%3Dx%20onerror%3Dalert%28document.domain%29%3E/report.html"' in page
    assert "x&quot;&gt;&lt;img src=x onerror=alert(document.domain)&gt;" in page
    assert not list(tmp_path.glob(".*.tmp*"))  # written atomically


class _Tags(HTMLParser):
    """Every element name of a page, and the text of each <script> element."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[str] = []
        self.scripts: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        if tag == "script":
            self._in_script = True
            self.scripts.append("")

    def handle_endtag(self, tag: str) -> None:
        if tag == "script":
            self._in_script = False

    def handle_data(self, data: str) -> None:
        if self._in_script:
            self.scripts[-1] += data


@pytest.mark.slow
def test_every_page_of_a_study_of_hostile_trace_names_shows_them_as_text(tmp_path: Path,
                                                                          make_trace: Callable[..., Path]) -> None:
    """Issue 42 #3 and item 4, end to end: `kvtrace study` over two windows whose file names are markup writes
    index.html and a report.html per window in which the names are text only (no element of theirs, no
    script closed early), escaped where they show."""
    folder = tmp_path / "w"
    folder.mkdir()
    names = ['a"><img src=x onerror=alert(document.domain)>', "b<svg onload=alert(1)>&c"]
    for seed, name in enumerate(names, 1):
        make_trace(folder, seed, num_requests=200, duration_s=200).rename(folder / f"{name}.jsonl")
    proc = subprocess.run([sys.executable, "-m", "tongyi_trace.cli", "study", str(folder), "-o", str(tmp_path / "o"),
                           "-q", "-j", "1"], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    pages = [tmp_path / "o" / "index.html", *(tmp_path / "o" / "runs" / n / "report.html" for n in names)]
    for page in pages:
        html = page.read_text()
        parsed = _Tags()
        parsed.feed(html)
        parsed.close()
        assert not {"img", "svg"} & set(parsed.tags), page  # (a script closed early would show its rest as tags)
        # in the figures' data too, the names are entity-escaped labels (Plotly shows them, never reads tags)
        tags = ("\\u003cimg", "\\u003csvg", "<img s", "<svg o")
        assert not any(t in s for s in parsed.scripts[1:] for t in tags), page
        for name in names:
            assert name not in html
    index = pages[0].read_text()
    assert "a&quot;&gt;&lt;img src=x onerror=alert(document.domain)&gt;" in index
    assert "b&lt;svg onload=alert(1)&gt;&amp;c" in index
    assert '"x":["a&quot;&gt;&lt;img src=x onerror=alert(document.do\u2026",' in index  # the figures' labels (cut)
    for page, name in zip(pages[1:], names, strict=True):
        assert html_escape(name).replace("&quot;", "&#34;") in page.read_text()  # its trace, in its own report
