"""Section(s): stock LRU vs the workload-aware plugin inside vLLM on the same trace slice, side by side:
engine hit ratio, the simulator's predictions for both policies, TTFT (QTTFT) and the plugin's decision
counters (paper section 5 evaluation), with the paired intervals of the engine hit-ratio difference and of the mean
TTFT change (block bootstrap over sessions, as written by compare). Artifact:
RUN_DIR/replay/compare_A_vs_B.json written by `kvtrace compare` (docs/artifacts/compare.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tongyi_trace.report import fmt
from tongyi_trace.report.artifacts import read_versioned
from tongyi_trace.report.figures import Fig, fit_range, label, new_figure
from tongyi_trace.report.model import Headline, Section, Table
from tongyi_trace.run import RunDir
from tongyi_trace.schemas import COMPARE_SCHEMA
from tongyi_trace.sim.bootstrap import Interval
from tongyi_trace.sim.registry import PAPER_WA_GAIN_POINTS

REMEDY = "re-run 'kvtrace compare RUN_DIR/replay/A RUN_DIR/replay/B'"


def build(run: RunDir) -> list[Section]:
    """One section per compare_*.json in RUN_DIR/replay/, in name order."""
    root = run.path / "replay"
    if not root.is_dir():
        return []
    files = sorted(root.glob("compare_*.json"))
    return [_section(p, i) for i, p in enumerate(files)]


def _section(path: Path, index: int) -> Section:
    doc = read_versioned(path, COMPARE_SCHEMA, REMEDY)
    assert doc is not None  # build() lists existing files
    a: dict[str, Any] = doc.get("a") or {}
    b: dict[str, Any] = doc.get("b") or {}
    diff: dict[str, Any] = doc.get("diff") or {}
    na, nb = str(a.get("name", "A")), str(b.get("name", "B"))
    s = Section(key=f"compare-{index}", partial="compare", title=f"Engine comparison: {na} vs {nb}",
                paper_ref="section 5",
                definition="Engine hit ratio = cached / prompt tokens over completed requests; predictions = the "
                           "simulator on the same requests in send order at the engine's block size and "
                           "num_gpu_blocks - 1 blocks; TTFT includes queueing (QTTFT); decision times are the "
                           "plugin's own counters.")
    rows: list[tuple[str, str, str, str]] = [
        ("eviction", str(a.get("eviction", "")), str(b.get("eviction", "")), ""),
        ("completed requests", fmt.count(a.get("num_requests")), fmt.count(b.get("num_requests")), ""),
        ("engine KV blocks x block size", _blocks(a), _blocks(b), ""),
        ("engine hit ratio", fmt.ratio(a.get("engine_hit_ratio")), fmt.ratio(b.get("engine_hit_ratio")),
         _pp(diff.get("engine_hit_ratio"))),
    ]
    for pol in ("lru", "wa", "fitted"):
        rows.append((f"simulator prediction ({pol.upper()})", fmt.ratio(_pred(a, pol)), fmt.ratio(_pred(b, pol)),
                     _pp(diff.get(f"predicted_{pol}_hit_ratio"))))
    for q in ("mean", "p50", "p99"):
        rows.append((f"TTFT {q.upper() if q != 'mean' else q}", fmt.milliseconds((a.get("ttft_ms") or {}).get(q)),
                     fmt.milliseconds((b.get("ttft_ms") or {}).get(q)), _signed_ms(diff.get(f"ttft_{q}_ms"))))
    for key, title in (("evictions", "plugin evictions"), ("decision_mean_us", "decision time mean (us)"),
                       ("decision_p99_us", "decision time P99 (us)"), ("fallbacks", "plugin fallbacks to LRU")):
        rows.append((title, _plugin(a, key), _plugin(b, key), ""))
    s.tables["sides"] = Table(columns=["", na, nb, f"{nb} - {na}"], rows=[list(r) for r in rows])
    s.figures["hit"] = _hit_figure(na, a, nb, b)
    notes = [str(n) for n in doc.get("notes") or []]
    notes += [f"{na}: {n}" for n in a.get("notes") or []] + [f"{nb}: {n}" for n in b.get("notes") or []]
    s.values = {"a": na, "b": nb, "notes": notes, "diff_pp": _pp(diff.get("engine_hit_ratio")),
                "diff_p99": _signed_ms(diff.get("ttft_p99_ms"))}
    iv = doc.get("intervals")
    hit_iv = _interval(iv, "engine_hit_ratio_pp", "points", ".2f")
    ttft_iv = _interval(iv, "ttft_mean_change_pct", "%", ".1f")
    if iv:
        how = (f"{fmt.count(iv.get('num_paired'))} requests OK in both, bootstrap over "
               f"{fmt.count(iv.get('num_groups'))} {iv.get('resampled', '')}")
        s.tables["sides"].rows.extend([
            [f"engine hit ratio {nb} - {na}, {_level(iv)} interval", "", "", hit_iv],
            [f"TTFT mean change {nb} vs {na}, {_level(iv)} interval", "", "", ttft_iv],
            ["intervals: paired requests", "", "", how],
        ])
    s.values.update(diff_pp_interval=hit_iv if iv else None, ttft_interval=ttft_iv if iv else None)
    s.headline = [Headline(f"engine hit ratio {nb} - {na}", hit_iv if iv else s.values["diff_pp"],
                           f"WA +{PAPER_WA_GAIN_POINTS[0]} to +{PAPER_WA_GAIN_POINTS[1]} points over the best "
                           "baseline")]
    return s


def _level(iv: dict[str, Any]) -> str:
    """'95%': the intervals' confidence level."""
    c = iv.get("confidence")
    return f"{100 * float(c):g}%" if isinstance(c, int | float) else fmt.NA


def _interval(iv: dict[str, Any] | None, key: str, unit: str, spec: str) -> str:
    """'+8.89 +- 25.00 points [+0.00, +50.00]' from the artifact's {point, lo, hi, confidence} (n/a when
    missing)."""
    got = (iv or {}).get(key) or {}
    if not all(isinstance(got.get(k), int | float) for k in ("point", "lo", "hi", "confidence")):
        return fmt.NA
    i = Interval(float(got["point"]), float(got["lo"]), float(got["hi"]), float(got["confidence"]))
    sep = " " if unit == "points" else ""
    return f"{i.text('+' + spec)}{sep}{unit} [{i.lo:+{spec}}, {i.hi:+{spec}}]"


def _blocks(side: dict[str, Any]) -> str:
    return f"{fmt.count(side.get('num_gpu_blocks'))} x {fmt.count(side.get('block_size'))} tokens"


def _pred(side: dict[str, Any], pol: str) -> float | None:
    p: float | None = (side.get("predicted_hit_ratio") or {}).get(pol)
    return p


def _pp(x: float | None) -> str:
    return fmt.NA if x is None else f"{100 * x:+.2f} points"


def _signed_ms(x: float | None) -> str:
    return fmt.NA if x is None else ("+" if x >= 0 else "-") + fmt.milliseconds(abs(x))


def _plugin(side: dict[str, Any], key: str) -> str:
    p = side.get("plugin")
    if not p:
        return "no plugin"
    return fmt.count(p.get(key)) if key in ("evictions", "fallbacks") else fmt.num(p.get(key))


def _hit_figure(na: str, a: dict[str, Any], nb: str, b: dict[str, Any]) -> Fig:
    fig = new_figure(x_title="replay", y_title="token hit ratio (axis fitted to the bars)", barmode="group")
    x = [label(na), label(nb)]
    drawn = [a.get("engine_hit_ratio"), b.get("engine_hit_ratio")]
    fig.add_bar(x=x, y=drawn, name="engine (measured)")
    for pol in ("lru", "wa", "fitted"):
        y = [_pred(a, pol), _pred(b, pol)]
        if any(v is not None for v in y):
            fig.add_bar(x=x, y=y, name=f"simulator {pol.upper()} (predicted)")
            drawn += y
    fig.update_yaxes(range=fit_range(drawn, 0.0, 1.0), tickformat=".1%")  # the differences, not 0-100%
    return fig
