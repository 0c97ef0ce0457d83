"""The plugin's stats file: a counter that changes while the file is being written is written by the next
flush (not lost until some later change), and a reader waits until the file has settled."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from tongyi_trace.vllm_plugin.stats import STATS_FILE, PluginStats, read_settled_stats, read_stats


def test_a_change_during_a_write_is_written_by_the_next_flush(tmp_path: Path) -> None:
    stats = PluginStats(mode="wa", stats_dir=tmp_path, flush_every_s=3600.0)  # no background flush here
    seen = {"n": 0}

    def section() -> dict[str, int]:  # the scheduler thread counts a request while the document is copied
        seen["n"] += 1
        stats.maybe_flush()
        return {"n": seen["n"]}

    stats.sections["guard"] = section
    stats.write()
    assert read_stats(tmp_path)["guard"] == {"n": 1}  # type: ignore[index]
    assert stats._dirty  # the change made during the copy is still to be written
    stats.sections["guard"] = lambda: {"n": seen["n"]}
    stats.write()
    assert not stats._dirty


def test_read_settled_stats_waits_for_the_last_write(tmp_path: Path) -> None:
    stats = PluginStats(mode="wa", stats_dir=tmp_path, flush_every_s=3600.0)
    stats.evictions = 1
    stats.write()

    def late_write() -> None:  # the engine writes its last counts half a second after the reader started
        time.sleep(0.5)
        stats.evictions = 2
        stats.write()

    t = threading.Thread(target=late_write)
    t.start()
    doc = read_settled_stats(tmp_path)
    t.join()
    assert doc is not None and doc["evictions"] == 2
    assert read_settled_stats(tmp_path / "missing") is None
    assert json.loads((tmp_path / STATS_FILE).read_text())["evictions"] == 2
