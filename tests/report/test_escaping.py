"""Strings from the trace can never become markup: HTML text is escaped, embedded JSON cannot close
its <script> element, and Plotly labels are entity-escaped (shown literally)."""

from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from tongyi_trace.report import render_report
from tongyi_trace.report.figures import dumps_script_safe, figure_json, label, new_figure
from tongyi_trace.run import RunDir

EVIL = "<script>alert(1)</script>"  # the type the fixture trace uses (conftest.py)
EVIL_USER = "</script><img src=x onerror=alert(2)>"  # and one user id


class _Scripts(HTMLParser):
    """Collects every <script> element (attributes and text) and every element name seen."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.scripts: list[tuple[dict[str, str | None], str]] = []
        self.tags: list[str] = []
        self._in_script: dict[str, str | None] | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        if tag == "script":
            self._in_script, self._text = dict(attrs), []

    def handle_endtag(self, tag: str) -> None:
        if tag == "script" and self._in_script is not None:
            self.scripts.append((self._in_script, "".join(self._text)))
            self._in_script = None

    def handle_data(self, data: str) -> None:
        if self._in_script is not None:
            self._text.append(data)


def _parse(html: str) -> _Scripts:
    p = _Scripts()
    p.feed(html)
    p.close()
    return p


def test_hostile_trace_strings_render_as_text(evil_run: RunDir) -> None:
    html = render_report(evil_run).read_text()
    assert EVIL not in html and EVIL_USER not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html  # shown, as text (source path, findings...)
    parsed = _parse(html)
    # Exactly the page's own scripts: plotly.js, the template, the figures, the drawing code.
    kinds = [attrs.get("type") or "js" for attrs, _ in parsed.scripts]
    assert kinds == ["js", "application/json", "application/json", "js"]
    assert "img" not in parsed.tags
    payloads = [json.loads(text) for attrs, text in parsed.scripts if attrs.get("type") == "application/json"]
    # Each JSON payload is intact (nothing closed it early), and the hostile strings did go through the
    # figures: as entity-escaped labels, which Plotly shows literally.
    figures = json.dumps(payloads[1])
    assert json.dumps("&lt;script&gt;alert(1)&lt;/script&gt;") in figures
    assert json.dumps("&lt;/script&gt;&lt;img src=x onerror=alert(2)&gt;") in figures


@given(st.text())
def test_script_safe_json_round_trips_and_cannot_close_a_script(s: str) -> None:
    out = dumps_script_safe({"k": s, "evil": EVIL})
    assert "<" not in out and ">" not in out and "&" not in out
    assert "\u2028" not in out and "\u2029" not in out
    assert json.loads(out) == {"k": s, "evil": EVIL}


def test_figure_json_escapes_labels_and_script_breakouts() -> None:
    fig = new_figure(x_title=label(EVIL))
    fig.add_bar(x=[label(EVIL), label(EVIL_USER)], y=[1, 2], name=label(EVIL))
    text = figure_json(fig)
    assert "<" not in text and ">" not in text
    data = json.loads(text)
    # Plotly renders entities literally, so the label shows the original string and no tag is parsed.
    assert data["data"][0]["name"] == "&lt;script&gt;alert(1)&lt;/script&gt;"
    assert data["data"][0]["x"] == ["&lt;script&gt;alert(1)&lt;/script&gt;",
                                    "&lt;/script&gt;&lt;img src=x onerror=alert(2)&gt;"]
    assert "template" not in data["layout"] or not data["layout"]["template"]


def test_a_nul_in_a_type_name_is_shown_not_written_raw(tmp_path: Path) -> None:
    """Issue 42: a type name holding a NUL (and another control character) reached report.html raw."""
    from tongyi_trace.analysis import run_analyses
    from tongyi_trace.trace.ingest import ingest_trace

    trace = tmp_path / "t.jsonl"
    recs = [{"chat_id": i, "parent_chat_id": -1, "timestamp": float(i), "input_length": 32, "output_length": 2,
             "type": "te\u0000xt\u001b", "turn": 1, "hash_ids": [1, 2 + i]} for i in range(3)]
    trace.write_text("".join(json.dumps(r) + "\n" for r in recs))
    ingest_trace(trace, tmp_path / "run")
    run_analyses(RunDir(tmp_path / "run"), only="request_mix,turn_hits")  # the sections that name the types
    html = render_report(RunDir(tmp_path / "run")).read_text()
    assert "\x00" not in html and "\x1b" not in html
    assert "te\\x00xt\\x1b" in html


def test_hostile_file_folder_and_replay_names_render_as_text(tiny_bailian_path: Path, tmp_path: Path) -> None:
    """Issue 42 item 4: every name a user chooses reaches report.html as text: the trace's file name, the run
    folder's, the replays' (--name) and the comparison of two of them (kvtrace compare)."""
    from typer.testing import CliRunner

    from tongyi_trace.cli import app
    from tongyi_trace.replay.standin import StandInState, serve

    trace = tmp_path / 'x"><img src=x onerror=alert(document.domain)>.jsonl'
    trace.write_text(tiny_bailian_path.read_text())
    run = tmp_path / "r<img src=x onerror=alert(3)>"
    names = ["<img src=y onerror=alert(4)>", "a&b<svg onload=alert(5)>"]
    cli = CliRunner()
    assert cli.invoke(app, ["ingest", str(trace), "-o", str(run), "-q"]).exit_code == 0
    httpd = serve(StandInState(block_size=16, fail_every=4))
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}"
        for name in names:
            r = cli.invoke(app, ["replay", str(run), "--server", url, "--name", name, "--speedup", "1000",
                                 "--max-in-flight", "1", "-q"])
            assert r.exit_code == 0, r.output
    finally:
        httpd.shutdown()
        httpd.server_close()
    r = cli.invoke(app, ["compare", str(run / "replay" / names[0]), str(run / "replay" / names[1]), "-q"])
    assert r.exit_code == 0, r.output
    r = cli.invoke(app, ["report", str(run), "-q"])
    assert r.exit_code == 0, r.output
    html = (run / "report.html").read_text()
    parsed = _parse(html)
    assert "img" not in parsed.tags and "svg" not in parsed.tags
    assert [attrs.get("type") or "js" for attrs, _ in parsed.scripts] == ["js", "application/json",
                                                                          "application/json", "js"]
    for raw in ("<img src=x onerror=alert(document.domain)>", *names, "<img src=x onerror=alert(3)>"):
        assert raw not in html
    assert "x&#34;&gt;&lt;img src=x onerror=alert(document.domain)&gt;.jsonl" in html or \
        "x&quot;&gt;&lt;img src=x onerror=alert(document.domain)&gt;.jsonl" in html  # the source, as text
    assert "Live replay on vLLM: &lt;img src=y onerror=alert(4)&gt;" in html
    assert "a&amp;b&lt;svg onload=alert(5)&gt;" in html  # the second replay, and B of the comparison
