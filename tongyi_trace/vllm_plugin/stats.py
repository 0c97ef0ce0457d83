"""Counters of the kvtrace vLLM plugin and the stats file `kvtrace.plugin_stats/1` that exposes them.

Inside the engine (EngineCore process) the plugin counts evictions it decided (total and per category),
the time each decision took (sum, count and a log-spaced histogram, so a replay can take the
difference of two snapshots and still get a mean and a P99 of its own window), hits on free blocks,
and fallbacks to LRU with their first reasons. A daemon thread writes the counters atomically to
`STATS_DIR/plugin_stats.json` at most once a second while they change, and once more at exit.
Standard library only: `kvtrace compare` and `kvtrace replay` read the file with `read_stats`.

Beside it, `plugin_stats.prom` holds the same counters in the Prometheus text format (0.0.4), written
atomically with the JSON file, for a node-exporter textfile collector or any scraper (docs/guard.md):
evictions and hits per category, fallbacks, and, with the guard or the refit on (the `guard` section),
the guard's mode, switches, both windowed hit-ratio estimates, refits, and per category the observed
vs predicted reuse CDF at a few horizons and the KS distance of the recent window.
"""

from __future__ import annotations

import atexit
import bisect
import contextlib
import json
import math
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tongyi_trace.schemas import PLUGIN_STATS_SCHEMA

STATS_FILE = "plugin_stats.json"
PROM_FILE = "plugin_stats.prom"
# Histogram edges in nanoseconds: 20 buckets a decade from 100 ns to 1 s; bucket i counts
# durations in [edge[i-1], edge[i]); bucket 0 is below 100 ns, the last one 1 s and above.
HIST_EDGES_NS: list[float] = [100.0 * 10 ** (i / 20) for i in range(141)]
_MAX_REASONS = 5


FLUSH_EVERY_S = 1.0  # how often the plugin rewrites its stats file when a counter changed


class PluginStats:
    """Mutable counters, written to a stats file by a background thread when a folder is given."""

    def __init__(self, mode: str, stats_dir: str | Path | None = None, info: dict[str, Any] | None = None,
                 flush_every_s: float = FLUSH_EVERY_S) -> None:
        self.mode = mode
        self.info = dict(info or {})
        self.evictions = 0                       # blocks whose cached content the policy evicted
        self.evictions_by_category: dict[str, int] = {}
        self.reuses_uncached = 0                 # free blocks without a hash handed out (no eviction)
        self.decision_ns_sum = 0
        self.decision_hist = [0] * (len(HIST_EDGES_NS) + 1)
        self.hits_on_free = 0                    # cached free blocks pinned again by a prefix hit
        self.hits_by_category: dict[str, int] = {}  # the same, by category of the block's last release
        self.sections: dict[str, Callable[[], dict[str, Any]]] = {}  # name -> its part of the document
        self.num_held = 0                        # leaf_only: victims held back while they had cached children
        self.fallbacks = 0
        self.fallback_reasons: list[str] = []
        self.started_unix_s = time.time()
        self._dirty = False
        self._path = Path(stats_dir) / STATS_FILE if stats_dir is not None else None
        self._flush_every_s = flush_every_s
        self._lock = threading.Lock()
        if self._path is not None:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            self.write()
            threading.Thread(target=self._flusher, name="kvtrace-stats", daemon=True).start()
            atexit.register(self.write)

    def record_eviction(self, category: str, decision_ns: int, cached: bool) -> None:
        """Count one decided eviction of CATEGORY that took DECISION_NS."""
        if not cached:
            self.reuses_uncached += 1
            return
        self.evictions += 1
        self.evictions_by_category[category] = self.evictions_by_category.get(category, 0) + 1
        self.decision_ns_sum += decision_ns
        self.decision_hist[bisect.bisect_right(HIST_EDGES_NS, decision_ns)] += 1
        self._dirty = True

    def record_hit(self, category: str) -> None:
        """Count one hit on a free cached block last released by a request of CATEGORY."""
        self.hits_by_category[category] = self.hits_by_category.get(category, 0) + 1
        self._dirty = True

    def record_fallback(self, reason: str) -> None:
        """Count one decision that fell back to LRU, keeping the first few reasons."""
        self.fallbacks += 1
        if len(self.fallback_reasons) < _MAX_REASONS:
            self.fallback_reasons.append(reason[:300])
        self._dirty = True

    def maybe_flush(self) -> None:
        """Mark the counters as changed (the background thread writes them)."""
        self._dirty = True

    def snapshot(self) -> dict[str, Any]:
        """The counters as a `kvtrace.plugin_stats/1` document."""
        doc: dict[str, Any] = {
            "schema": PLUGIN_STATS_SCHEMA,
            "mode": self.mode,
            "pid": os.getpid(),
            "started_unix_s": self.started_unix_s,
            "updated_unix_s": time.time(),
            "evictions": self.evictions,
            "evictions_by_category": dict(self.evictions_by_category),
            "reuses_uncached": self.reuses_uncached,
            "hits_on_free": self.hits_on_free,
            "hits_by_category": dict(self.hits_by_category),
            "num_held": self.num_held,
            "decision_ns_sum": self.decision_ns_sum,
            "decision_hist_edges_ns": HIST_EDGES_NS,
            "decision_hist": list(self.decision_hist),
            "fallbacks": self.fallbacks,
            "fallback_reasons": list(self.fallback_reasons),
        }
        doc.update(self.info)
        doc.update(decision_summary(doc))
        for name, section in list(self.sections.items()):
            doc[name] = section()
        return doc

    def write(self) -> None:
        """Write the stats file atomically (no-op without a folder)."""
        if self._path is None:
            return
        with self._lock:
            # cleared before the copy: a counter the scheduler thread changes meanwhile marks it again, so
            # the next flush writes it (cleared after, that change waited for some later one)
            self._dirty = False
            for _ in range(3):  # the scheduler thread may resize a dict while we copy it
                try:
                    doc = self.snapshot()
                    break
                except RuntimeError:
                    continue
            else:
                self._dirty = True
                return
            try:
                for path, text in ((self._path, json.dumps(doc, indent=1) + "\n"),
                                   (self._path.with_name(PROM_FILE), prometheus_text(doc))):
                    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
                    tmp.write_text(text)
                    os.replace(tmp, path)
            except OSError:
                self._dirty = True
                raise

    def _flusher(self) -> None:
        while True:
            time.sleep(self._flush_every_s)
            if self._dirty:
                with contextlib.suppress(OSError):
                    self.write()


def _label(v: object) -> str:
    return str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def prometheus_text(doc: dict[str, Any]) -> str:
    """The stats document DOC in the Prometheus text format (metric names `kvtrace_*`)."""
    out: list[str] = []

    def metric(name: str, kind: str, help_: str, samples: list[tuple[dict[str, object], float]]) -> None:
        out.append(f"# HELP kvtrace_{name} {help_}")
        out.append(f"# TYPE kvtrace_{name} {kind}")
        for labels, v in samples:
            lab = ",".join(f'{k}="{_label(x)}"' for k, x in labels.items())
            val = float(v)
            text = "NaN" if val != val else repr(val)
            out.append(f"kvtrace_{name}{{{lab}}} {text}" if lab else f"kvtrace_{name} {text}")

    mode = {"mode": doc.get("mode", "")}
    metric("evictions_total", "counter", "Blocks evicted by the policy, by category of the block.",
           [({**mode, "category": c}, n) for c, n in sorted((doc.get("evictions_by_category") or {}).items())])
    metric("hits_on_free_total", "counter", "Prefix hits on free cached blocks, by category of the block.",
           [({**mode, "category": c}, n) for c, n in sorted((doc.get("hits_by_category") or {}).items())])
    metric("fallbacks_total", "counter", "Decisions that fell back to LRU after an error.",
           [(mode, doc.get("fallbacks", 0))])
    g = doc.get("guard")
    if isinstance(g, dict):
        metric("guard_lru_mode", "gauge", "1 while the guard makes the cache evict in LRU order.",
               [(mode, g.get("mode") == "lru")])
        metric("guard_switches_total", "counter", "Switches of the guard (either way).", [(mode, g.get("switches", 0))])
        metric("guard_window_hit_ratio", "gauge", "Shadow hit ratio over the guard window, by eviction order.",
               [({**mode, "order": "policy"}, g.get("window_policy_hit_ratio", 0.0)),
                ({**mode, "order": "lru"}, g.get("window_lru_hit_ratio", 0.0))])
        metric("guard_time_in_mode_seconds_total", "counter", "Policy-clock seconds in each guard mode.",
               [({**mode, "guard_mode": k}, v) for k, v in sorted((g.get("time_in_mode_s") or {}).items())])
        metric("refits_total", "counter", "Online refits run.", [(mode, g.get("refits", 0))])
        cats = g.get("category_metrics") or {}
        cdf: list[tuple[dict[str, object], float]] = []
        ks: list[tuple[dict[str, object], float]] = []
        for c, m in sorted(cats.items()):
            ks.append(({**mode, "category": c}, m.get("ks", math.nan)))
            for k, v in sorted(m.items()):
                for kind in ("observed", "predicted"):
                    if k.startswith(f"{kind}_cdf_"):
                        cdf.append(({**mode, "category": c, "kind": kind,
                                     "horizon_s": k[len(kind) + 5:-1]}, v))
        metric("reuse_cdf", "gauge", "Reuse probability within horizon_s: the recent window (observed) "
               "vs the running model (predicted), at the last refit.", cdf)
        metric("reuse_ks", "gauge", "KS distance of the recent window to the running model, at the last refit.", ks)
    return "\n".join(out) + "\n"


def decision_summary(doc: dict[str, Any]) -> dict[str, float | None]:
    """Mean and P50/P99 decision time in microseconds from a stats document (or a difference of two)."""
    count = int(doc.get("evictions", 0))
    hist = doc.get("decision_hist") or []
    if count <= 0 or not hist:
        return {"decision_mean_us": None, "decision_p50_us": None, "decision_p99_us": None}
    return {
        "decision_mean_us": float(doc.get("decision_ns_sum", 0)) / count / 1000.0,
        "decision_p50_us": _hist_quantile(hist, 0.50) / 1000.0,
        "decision_p99_us": _hist_quantile(hist, 0.99) / 1000.0,
    }


def _hist_quantile(hist: list[int], q: float) -> float:
    """Upper edge (ns) of the bucket holding quantile Q: an upper bound within 12% of the true value."""
    total = sum(hist)
    rank = math.ceil(q * total)
    acc = 0
    for i, c in enumerate(hist):
        acc += c
        if acc >= rank and c > 0:
            return HIST_EDGES_NS[min(i, len(HIST_EDGES_NS) - 1)]
    return HIST_EDGES_NS[-1]


def read_stats(path: str | Path) -> dict[str, Any] | None:
    """The stats document in PATH (a folder holding plugin_stats.json, or the file); None when absent."""
    p = Path(path)
    if p.is_dir():
        p = p / STATS_FILE
    try:
        doc = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return doc if isinstance(doc, dict) and doc.get("schema") == PLUGIN_STATS_SCHEMA else None


def read_settled_stats(path: str | Path, timeout_s: float = 20.0) -> dict[str, Any] | None:
    """The stats document in PATH once the plugin has nothing left to write: two reads more than twice its
    flush interval apart with the same update time (any change since its last write would have been written
    in between); the last read after TIMEOUT_S. For a reader that has just seen the engine answer its last
    request, whose counters the engine may still be writing."""
    deadline = time.monotonic() + timeout_s
    last = read_stats(path)
    while True:
        time.sleep(2 * FLUSH_EVERY_S)
        doc = read_stats(path)
        settled = doc is None or (last is not None and doc.get("updated_unix_s") == last.get("updated_unix_s"))
        if settled or time.monotonic() >= deadline:
            return doc
        last = doc


def stats_delta(before: dict[str, Any] | None, after: dict[str, Any]) -> dict[str, Any]:
    """The counters of AFTER minus BEFORE (the same engine: equal pid), with recomputed summaries.

    When BEFORE is None or from another engine process, AFTER is returned whole."""
    if before is None or before.get("pid") != after.get("pid") or \
            before.get("started_unix_s") != after.get("started_unix_s"):
        return dict(after)
    out = dict(after)
    for key in ("evictions", "reuses_uncached", "hits_on_free", "num_held", "decision_ns_sum", "fallbacks"):
        out[key] = int(after.get(key, 0)) - int(before.get(key, 0))
    cats_before = before.get("evictions_by_category") or {}
    out["evictions_by_category"] = {
        k: v - int(cats_before.get(k, 0)) for k, v in (after.get("evictions_by_category") or {}).items()
        if v - int(cats_before.get(k, 0)) > 0}
    hb = before.get("decision_hist") or []
    out["decision_hist"] = [a - (hb[i] if i < len(hb) else 0) for i, a in enumerate(after.get("decision_hist") or [])]
    out.update(decision_summary(out))
    return out
