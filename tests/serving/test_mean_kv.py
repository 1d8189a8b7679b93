"""A region's time-weighted KV (``kv_mean_tokens`` in the serve report) is the same float
whatever the number of BLAS threads: BLAS's dot product splits a long sum among its threads,
which changed its last digits with the number of cores."""

import os
import subprocess
import sys

import numpy as np

from wse_emu.serving.serve import _mean_kv

PROGRAM = """
import numpy as np
from wse_emu.serving.serve import _mean_kv
rng = np.random.default_rng(1)
times = np.cumsum(rng.random(300_000) * 1e3)
trace = np.column_stack((times, rng.integers(0, 150_000, len(times)).astype(float)))
print(repr(_mean_kv(trace, float(times[0]), float(times[-1] + 5.0))))
"""


def test_the_same_float_with_one_or_two_blas_threads():
    got = set()
    for threads in ("1", "2"):
        env = {**os.environ, "OPENBLAS_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
        out = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True,
                             env=env, check=True)
        got.add(out.stdout.strip())
    assert len(got) == 1, got


def test_it_weights_each_level_by_how_long_it_was_held():
    # 10 tokens for 2 cycles, then 30 for 6 (until the end at cycle 10): 200 over 8 cycles.
    trace = np.array([[2.0, 10.0], [4.0, 30.0]])
    assert _mean_kv(trace, 2.0, 10.0) == 200.0 / 8.0
    assert _mean_kv(np.zeros((0, 2)), 0.0, 1.0) == 0.0
