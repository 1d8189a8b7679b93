"""Number formats of a functional run: what is stored and sent, and what a PE computes in.

Arithmetic inside a PE's task is float32: FP16 multiplies are exact in float32 and the FMAC
accumulates there. What leaves a PE or stays in SRAM (weights, activations, partial sums on the
wire, the KV cache) is rounded to the run's dtype, as the wavelets and buffers the program sizes
in ``dtype_bytes`` hold it, softmax partials (running max, sum and weighted values) included.
Norms' sums of squares stay float32, as the program sends them (4-byte wavelets). With dtype
float32 every rounding is the identity, so a run differs from an exact forward pass only by the
order of its additions.
"""

from __future__ import annotations

import numpy as np

from wse_emu.errors import UserError

DTYPES = {"float32": np.float32, "float16": np.float16}


class Numerics:
    def __init__(self, dtype: str = "float32"):
        if dtype not in DTYPES:
            raise UserError(f"`dtype` must be one of {', '.join(DTYPES)}, got {dtype!r}")
        self.name = dtype
        self.storage = np.dtype(DTYPES[dtype])
        self.exact = self.storage == np.float32

    def round(self, values) -> np.ndarray:
        """Values as stored or sent: rounded to the dtype, held as float32 for arithmetic."""
        values = np.asarray(values, dtype=np.float32)
        if self.exact:
            return values
        with np.errstate(over="ignore"):
            return values.astype(self.storage).astype(np.float32)
