"""One micro-batch through a pipeline of stages: the recurrence at the heart of serving.

Stage s starts at max(arrival at s, free[s]), where arrival at s is when the micro-batch left
stage s - 1 plus the hop between them. Serving runs this hundreds of thousands of times on short
arrays, where a compiled loop costs a fraction of the numpy calls it replaces.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def advance(free: np.ndarray, cycles: np.ndarray, enter: float, starts: np.ndarray) -> float:
    """Put a micro-batch entering at ``enter`` through the stages; ``cycles`` holds every
    stage's time, then the hops' in all (spread evenly over the gaps between stages); anything
    after those is not read.
    Updates ``free`` (when each stage is next free), writes each stage's start into ``starts``
    and returns when the micro-batch leaves the last stage."""
    stages = free.shape[0]
    hop = cycles[stages] / max(stages - 1, 1)
    t = enter
    for s in range(stages):
        if s:
            t += hop
        if free[s] > t:
            t = free[s]
        starts[s] = t
        t += cycles[s]
        free[s] = t
    return t
