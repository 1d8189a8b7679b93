"""What the functional engine's elementwise and rotary kernels compute: the activations (SiLU,
GELU with the tanh approximation, gpt-oss's clamped SwiGLU slope), soft caps, the softmax and
the rotary embedding with each rope scaling the engine models (refused by name otherwise)."""

from __future__ import annotations

import math

import numpy as np

from wse_emu.errors import UserError
from wse_emu.models.spec import ModelSpec


def silu(x: np.ndarray) -> np.ndarray:
    return x * (0.5 * (1.0 + np.tanh(0.5 * x)))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GELU with the tanh approximation (Gemma's gelu_pytorch_tanh)."""
    c = np.float32(math.sqrt(2.0 / math.pi))
    return 0.5 * x * (1.0 + np.tanh(c * (x + np.float32(0.044715) * x * x * x)))


def softcap(x: np.ndarray, cap: float) -> np.ndarray:
    return np.float32(cap) * np.tanh(x / np.float32(cap))


ROPE_SCALINGS = (None, "linear", "llama3", "longrope", "yarn")
SWIGLU_ALPHA = np.float32(1.702)  # gpt-oss's sigmoid slope in its SwiGLU (a constant of its code)


def inverse_frequencies(model: ModelSpec, layer: int = 0, length: int = 1) -> np.ndarray:
    """Rotary frequencies per pair of features of ``layer``, with the model's rope scaling:
    ``linear`` divides them all by the factor; ``llama3`` divides the low ones (wavelengths
    above original positions / low_freq_factor) by it, keeps the high ones (wavelengths below
    original positions / high_freq_factor), and blends linearly in wavelength between;
    ``longrope`` divides each pair by its short factor while the sequence (``length``
    positions) stays within the original context, by its long factor beyond it."""
    if model.rope.scaling not in ROPE_SCALINGS:
        raise UserError(f"{model.name}: rope_scaling {model.rope.scaling!r} is not modelled by "
                        "the functional engine (linear, llama3, longrope and yarn are)")
    d = model.attention.head_dim
    theta = model.rope_theta_of(layer)
    inv_freq = 1.0 / theta ** (np.arange(0, d, 2, dtype=np.float64) / d)
    if not model.rope_scaled(layer):
        return inv_freq
    factor = model.rope.factor
    if model.rope.scaling == "linear":
        return inv_freq / factor
    if model.rope.scaling == "llama3":
        context = model.rope.original_max_positions
        low, high = model.rope.low_freq_factor, model.rope.high_freq_factor
        wavelength = 2 * np.pi / inv_freq
        blend = np.clip((context / wavelength - low) / (high - low), 0.0, 1.0)
        return inv_freq * (blend + (1.0 - blend) / factor)
    if model.rope.scaling == "longrope":
        long = length > model.rope.original_max_positions
        factors = model.rope.long_factor if long else model.rope.short_factor
        return inv_freq / np.asarray(factors, dtype=np.float64)
    if model.rope.scaling == "yarn":
        keep = yarn_keep(model)
        return inv_freq * keep + inv_freq / factor * (1 - keep)
    return inv_freq


def yarn_keep(model: ModelSpec) -> np.ndarray:
    """YaRN's share of each pair's original frequency: 1 for pairs turning more than
    beta_fast times over the original context, 0 (divided by the factor) for those turning
    fewer than beta_slow times, linear in the pair index between (the bounds rounded outward
    when the model truncates them)."""
    d, base = model.attention.head_dim, model.rope.theta
    context = model.rope.original_max_positions

    def pair(turns: float) -> float:  # the (fractional) pair index that turns so many times
        return d * math.log(context / (turns * 2 * math.pi)) / (2 * math.log(base))

    lo, hi = pair(model.rope.beta_fast), pair(model.rope.beta_slow)
    if model.rope.truncate:
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, d - 1)
    hi = hi + 0.001 if hi == lo else hi
    return 1 - np.clip((np.arange(d // 2, dtype=np.float64) - lo) / (hi - lo), 0, 1)


def rope_magnitude(model: ModelSpec) -> float:
    """What cos and sin are multiplied by: longrope's attention factor (given, or from how far
    the context was extended), YaRN's (given, or 0.1 ln(factor) + 1), else 1."""
    if model.rope.scaling == "yarn":
        if model.rope.attention_factor is not None:
            return model.rope.attention_factor
        factor = model.rope.factor
        return 1.0 if factor <= 1 else 0.1 * math.log(factor) + 1.0
    if model.rope.scaling != "longrope":
        return 1.0
    if model.rope.attention_factor is not None:
        return model.rope.attention_factor
    scale = model.max_position_embeddings / model.rope.original_max_positions
    if scale <= 1.0:
        return 1.0
    return math.sqrt(1 + math.log(scale) / math.log(model.rope.original_max_positions))


def rotary(x: np.ndarray, positions: np.ndarray, model: ModelSpec, layer: int = 0,
           length: int | None = None) -> np.ndarray:
    """Rotate (tokens, heads * head_dim) by position, pairing i with i + head_dim / 2 as
    Hugging Face does; angles in float64, applied in float32. ``length`` is the sequence's
    length after this call (longrope picks its factors by it)."""
    t, head_dim = len(x), model.attention.head_dim
    x = x.reshape(t, -1, head_dim)
    length = int(positions.max()) + 1 if length is None else length
    angles = np.outer(positions.astype(np.float64),
                      inverse_frequencies(model, layer, length))
    angles = np.concatenate([angles, angles], axis=-1)
    magnitude = rope_magnitude(model)
    cos = (np.cos(angles) * magnitude).astype(np.float32)[:, None, :]
    sin = (np.sin(angles) * magnitude).astype(np.float32)[:, None, :]
    half = head_dim // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return (x * cos + rotated * sin).reshape(t, -1)


def softmax(x: np.ndarray) -> np.ndarray:
    z = np.exp(x - x.max(axis=-1, keepdims=True))
    return z / z.sum(axis=-1, keepdims=True)
