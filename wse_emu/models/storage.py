"""The values a weight matrix holds in its stored format, as the wafer's PEs widen them: what
the functional engine multiplies by, so that its numbers are those of the format the SRAM plan
sizes and the cost model charges (``ModelSpec.weight_format``, ``expert_weight_format``).

- ``fp8``: OCP FP8 E4M3 (4 exponent bits, bias 7, 3 mantissa bits; largest 448, subnormals
  down to 2 ** -9) with one scale per matrix, its largest magnitude over 448; a PE widens
  each value (one operation) and the scale, common to every product, applies to the sums.
- ``int8``: symmetric 8-bit integers with one scale per output (its largest magnitude over
  127); a PE widens and scales each value (two operations).
- ``mxfp4``: blocks of 32 inputs sharing a power-of-two scale (``wse_emu.models.mxfp4``).
- ``bf16``, ``fp16``: each value rounded to that 16-bit float.
- ``native``: as given (the functional engine rounds to its own dtype).
Every rounding is to the nearest value, ties to even.
"""

from __future__ import annotations

import numpy as np

from wse_emu.models import mxfp4

E4M3_MAX = 448.0
E4M3_MIN_EXPONENT = -6  # the smallest normal exponent; below it the spacing stays 2 ** -9
E4M3_MANTISSA_BITS = 3
INT8_MAX = 127


def e4m3(values: np.ndarray) -> np.ndarray:
    """``values`` rounded to FP8 E4M3 (saturating at 448), as float32."""
    v = np.asarray(values, dtype=np.float64)
    magnitude = np.abs(v)
    with np.errstate(divide="ignore"):
        exponent = np.floor(np.log2(np.where(magnitude > 0, magnitude, 1.0)))
    exponent = np.maximum(exponent, E4M3_MIN_EXPONENT)
    step = np.exp2(exponent - E4M3_MANTISSA_BITS)
    rounded = np.round(v / step) * step  # numpy rounds halves to even
    return np.clip(rounded, -E4M3_MAX, E4M3_MAX).astype(np.float32)


def fp8_matrix(matrix: np.ndarray) -> np.ndarray:
    """A matrix as per-matrix-scaled E4M3 holds it."""
    m = np.asarray(matrix, dtype=np.float32)
    top = float(np.abs(m).max())
    if top == 0:
        return m.copy()
    scale = np.float32(top / E4M3_MAX)
    return (e4m3(m / scale) * scale).astype(np.float32)


def int8_matrix(matrix: np.ndarray) -> np.ndarray:
    """An (in, out) matrix as int8 with one scale per output holds it."""
    m = np.asarray(matrix, dtype=np.float32)
    top = np.abs(m).max(axis=0)
    scale = np.where(top > 0, top / INT8_MAX, 1.0).astype(np.float32)
    return (np.clip(np.round(m / scale), -INT8_MAX, INT8_MAX) * scale).astype(np.float32)


def bf16(values: np.ndarray) -> np.ndarray:
    """``values`` rounded to bfloat16 (the top half of a float32), as float32."""
    bits = np.asarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    # Round the low 16 bits away: to nearest, ties to the even upper half.
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.astype(np.uint32).view(np.float32)


def stored_matrix(fmt: str, matrix: np.ndarray, where: str = "a matrix") -> np.ndarray:
    """An (in, out) matrix as the format ``fmt`` stores it, widened to float32."""
    if fmt == "bf16":
        return bf16(matrix)
    if fmt == "fp16":
        with np.errstate(over="ignore"):
            return np.asarray(matrix, dtype=np.float32).astype(np.float16).astype(np.float32)
    if fmt == "fp8":
        return fp8_matrix(matrix)
    if fmt == "int8":
        return int8_matrix(matrix)
    if fmt == "mxfp4":
        return mxfp4.quantize(matrix, axis=0, where=where)
    return matrix
