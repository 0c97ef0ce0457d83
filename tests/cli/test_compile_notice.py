"""The first compile of a kernel says so on stderr, once, and a kernel read from numba's cache says nothing
(tongyi_trace/compile_notice.py). Cheap: one small kernel (sim/capacity.py's peak_live_blocks) compiled in a
child process against an empty private numba cache, then read back from it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tongyi_trace.compile_notice import NOTICE

REPO = Path(__file__).resolve().parents[2]
CHILD = """
import numpy as np
from tongyi_trace.cli._common import run_cli
from tongyi_trace.sim.capacity import peak_live_blocks

off, nxt = np.array([0, 2, 3], np.int64), np.array([1, 2, 2], np.int64)
print(run_cli(lambda: peak_live_blocks(off, nxt)), run_cli(lambda: peak_live_blocks(off, nxt)))
"""


def _child(cache_dir: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache_dir), "PYTHONPATH": str(REPO), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=True,
                          timeout=240)


def test_first_compile_says_so_once_and_a_cached_kernel_says_nothing(tmp_path: Path) -> None:
    cold = _child(tmp_path / "numba")
    # request 0's first block is used again by request 1: one live block at the boundary, for both calls
    assert cold.stdout.split() == ["1", "1"]
    assert cold.stderr.count(NOTICE) == 1  # on stderr, once a process, whatever it compiles next
    warm = _child(tmp_path / "numba")
    assert warm.stdout.split() == ["1", "1"] and NOTICE not in warm.stderr


WORKERS = """
import json
import os
import numpy as np
from tongyi_trace.executor import ExecutorOptions, map_tasks


def peak(task, shared):
    from tongyi_trace.sim.capacity import peak_live_blocks

    off, nxt = np.array([0, 2, 3], np.int64), np.array([1, 2, 2], np.int64)
    return int(peak_live_blocks(off, nxt)), os.getpid()


if __name__ == "__main__":
    from tongyi_trace.cli._common import run_cli

    outs = []
    run_cli(lambda: map_tasks(peak, [0, 1], {}, outs.append, ExecutorOptions("local", None, 2)))
    print(os.getpid(), " ".join(str(o.value[1]) for o in outs), " ".join(str(o.value[0]) for o in outs))
"""


def test_a_compile_in_an_executor_worker_is_said_by_the_caller_and_logged(tmp_path: Path) -> None:
    """A pool's workers compiling (fit's candidates) stall the command as much: the caller says the notice,
    once; and bench/bench_compile.py counts what they compile."""
    script, log = tmp_path / "workers.py", tmp_path / "compiles.jsonl"
    script.write_text(WORKERS)
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba"), "PYTHONPATH": str(REPO),
           "KVTRACE_COMPILE_LOG": str(log), "COLUMNS": "200"}
    env.pop("KVTRACE_NO_COMPILE_NOTICE", None)
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, check=True,
                          timeout=240)
    out = done.stdout.split("\n")[0].split(" ")
    parent, workers, values = int(out[0]), {int(p) for p in out[1:3]}, out[3:]
    assert values == ["1", "1"] and parent not in workers
    assert done.stderr.count(NOTICE) == 1
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    # the kernel compiled in a worker (the parent compiles nothing), each compile once per process
    assert {r["pid"] for r in rows} <= workers
    compiled = [r for r in rows if r["kernel"] == "tongyi_trace.sim.capacity.peak_live_blocks"]
    assert 1 <= len(compiled) == len({r["pid"] for r in compiled}) and all(r["cpu_s"] > 0 for r in compiled)
