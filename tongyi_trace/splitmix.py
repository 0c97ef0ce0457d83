"""splitmix64's finalizer (Steele, Lea, Flood, OOPSLA 2014): kvtrace's one stable 64-bit mix.

It makes prefix-chained block ids (trace/chain.py), prompt tokens (replay/prompts.py), the replay's
sampled requests (replay/schedule.py), spatial sampling (policy/sampling.py) and session routing.
`splitmix64_inplace` is the definition, on numpy uint64 arrays with wrapping arithmetic, in place (no
temporaries over millions of ids: trace/chain.py mixes block ids with it); `splitmix64` applies it to a
copy. `mix64` is its python-integer form, for one key at a time without numpy (the vLLM plugin, once per
block); tests/trace/test_splitmix.py holds both to it.
Standard library and numpy only: the plugin imports it.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # 2^64 / golden ratio: the generator's increment
M1 = np.uint64(0xBF58476D1CE4E5B9)
M2 = np.uint64(0x94D049BB133111EB)
CHAIN_SEED = np.uint64(0x6B76747261636521)  # "kvtrace!": chain_{-1} of prefix-chained block ids (trace/chain.py)
_MASK = (1 << 64) - 1
_GOLDEN_INT, _M1_INT, _M2_INT = int(GOLDEN), int(M1), int(M2)


_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)


def splitmix64_inplace(h: npt.NDArray[np.uint64], tmp: npt.NDArray[np.uint64]) -> None:
    """H = the splitmix64 finalizer of H + GOLDEN, elementwise and in place (TMP: scratch of H's shape)."""
    h += GOLDEN
    np.right_shift(h, _S30, out=tmp)
    h ^= tmp
    h *= M1
    np.right_shift(h, _S27, out=tmp)
    h ^= tmp
    h *= M2
    np.right_shift(h, _S31, out=tmp)
    h ^= tmp


def splitmix64(x: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """The splitmix64 finalizer of X + GOLDEN, elementwise over the uint64 array X (a new array)."""
    z = np.array(x, dtype=np.uint64)
    splitmix64_inplace(z, np.empty_like(z))
    return z


def mix64(key: int) -> int:
    """splitmix64 of KEY (any python int, taken modulo 2^64) as a python int."""
    z = (key + _GOLDEN_INT) & _MASK
    z = ((z ^ (z >> 30)) * _M1_INT) & _MASK
    z = ((z ^ (z >> 27)) * _M2_INT) & _MASK
    return z ^ (z >> 31)
