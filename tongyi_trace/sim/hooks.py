"""Compiled hooks that several policies share (the hook interface: policy_base.py). A policy file binds
them under the hook's name, e.g. `from tongyi_trace.sim.hooks import no_op as insert`."""

from __future__ import annotations

import numpy as np
from numba import njit

from tongyi_trace.sim.structs import q_unlink


@njit(cache=True, inline="always")
def no_op(bk: np.ndarray, hp: np.ndarray, g: np.ndarray, gf: np.ndarray,
          qs: np.ndarray, ip: np.ndarray, fp: np.ndarray, ft: np.ndarray, it: np.ndarray, x: int) -> None:
    """access or insert that changes nothing (the policy orders blocks at release or eviction)."""


@njit(cache=True, inline="always")
def unlink(bk: np.ndarray, hp: np.ndarray, g: np.ndarray, gf: np.ndarray,
           qs: np.ndarray, ip: np.ndarray, fp: np.ndarray, ft: np.ndarray, it: np.ndarray, x: int) -> None:
    """access that takes X out of its queue while the request runs (release appends it again)."""
    q_unlink(bk, qs, x)


@njit(cache=True, inline="always")
def keeps_none(bk: np.ndarray, hp: np.ndarray, g: np.ndarray, gf: np.ndarray,
               qs: np.ndarray, ip: np.ndarray, fp: np.ndarray, ft: np.ndarray, it: np.ndarray, x: int) -> bool:
    """keeps of a policy that reads nothing of a block once it left the cache (policy_base.py)."""
    return False
