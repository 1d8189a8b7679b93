"""MXFP4, as gpt-oss ships its experts (the OCP Microscaling format, MX v1.0): blocks of 32
four-bit E2M1 values sharing one E8M0 scale, 2 ** (code - 127).

A checkpoint stores a matrix as ``<name>_blocks`` (uint8, two values a byte, the first in the
low nibble: (..., rows, cols / 32, 16)) and ``<name>_scales`` (uint8: (..., rows, cols / 32)),
each block running along the matrix's last axis. Every value is a power of two times one of
sixteen E2M1 codes, so float32 holds it exactly: reading a checkpoint widens it without loss,
and the functional engine computes with exactly the values the wafer stores.
"""

from __future__ import annotations

import numpy as np

from wse_emu.errors import UserError

BLOCK = 32  # values sharing a scale
# E2M1 codes 0-15: sign bit, two exponent bits, one mantissa bit.
E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                 -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=np.float32)
E2M1_EMAX = 2  # the largest E2M1 value, 6, is 1.5 * 2 ** 2
SCALE_BIAS = 127


def dequantize(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """(..., G, 16) packed codes and (..., G) scales -> (..., G * 32) float32 values."""
    blocks = np.asarray(blocks, dtype=np.uint8)
    scales = np.asarray(scales, dtype=np.uint8)
    if blocks.shape[-1] != BLOCK // 2 or blocks.shape[:-1] != scales.shape:
        raise ValueError(f"MXFP4 blocks {blocks.shape} do not match scales {scales.shape}")
    codes = np.stack([blocks & 0x0F, blocks >> 4], axis=-1).reshape(*scales.shape, BLOCK)
    exponent = scales.astype(np.int32)[..., None] - SCALE_BIAS
    values = np.ldexp(E2M1[codes], exponent).astype(np.float32)
    return values.reshape(*scales.shape[:-1], scales.shape[-1] * BLOCK)


def encode(values: np.ndarray, where: str = "a matrix") -> tuple[np.ndarray, np.ndarray]:
    """Values -> (packed codes, scales), in blocks of 32 along the last axis.

    Each block's scale is the largest power of two at most its largest magnitude over 4 (the
    OCP rule: the block's largest value lands in E2M1's top binade); each value is rounded to
    the nearest code, ties to the even code, and saturates at 6."""
    values = np.asarray(values, dtype=np.float32)
    n = values.shape[-1]
    if n % BLOCK:
        raise UserError(f"{where}: MXFP4 needs its inputs in blocks of {BLOCK}, got {n}")
    blocks = values.reshape(*values.shape[:-1], n // BLOCK, BLOCK)
    amax = np.abs(blocks).max(axis=-1)
    with np.errstate(divide="ignore"):
        top = np.floor(np.log2(np.where(amax > 0, amax, 1.0))).astype(np.int32)
    scale_code = np.clip(np.where(amax > 0, top - E2M1_EMAX + SCALE_BIAS, 0), 0, 254)
    scaled = np.abs(blocks) / np.ldexp(np.float32(1), scale_code.astype(np.int32)
                                       - SCALE_BIAS)[..., None]
    grid = E2M1[:8]
    gap = np.abs(scaled[..., None] - grid)
    # The nearest code; of two equally near, the even one (its mantissa bit clear).
    nearest = gap == gap.min(axis=-1, keepdims=True)
    code = np.argmin(np.where(nearest, np.arange(8) % 2, 2), axis=-1).astype(np.uint8)
    code |= np.where(np.signbit(blocks), 8, 0).astype(np.uint8)
    packed = (code[..., 0::2] | (code[..., 1::2] << 4)).astype(np.uint8)
    # Contiguous, as a file writer takes the buffer as it lies.
    return np.ascontiguousarray(packed), np.ascontiguousarray(scale_code, dtype=np.uint8)


def quantize(values: np.ndarray, axis: int = -1, where: str = "a matrix") -> np.ndarray:
    """``values`` as MXFP4 stores them (blocks of 32 along ``axis``), as float32."""
    moved = np.moveaxis(np.asarray(values, dtype=np.float32), axis, -1)
    return np.moveaxis(dequantize(*encode(moved, where)), -1, axis)
