"""A plain-numpy forward pass of the Llama family (Llama, Mistral, Qwen2), for tests.

The yardstick the functional engine is checked against, so it is written to be read, not to be
fast: each step is the formula of Hugging Face's ``modeling_llama`` (pre-norm RMSNorm decoder
layers, rotary embeddings with the rotate_half convention, grouped-query attention with a causal
mask, a SiLU-gated MLP, a final norm and an LM head, tied to the embedding or not). Weights are
the Hugging Face-named arrays of ``wse_emu.weights``; linear weights are (out, in).

A ``ReferenceModel`` holds one sequence's KV cache: ``prefill(ids)`` starts a sequence and returns
the logits of every position, ``decode(next_id)`` appends one token and returns its logits, and
``forward(ids)`` appends several (a chunk of a chunked prefill).

Rope scaling of the ``linear`` and ``llama3`` types is applied as Hugging Face's
``modeling_rope_utils`` computes it (Llama 3.1's long-context frequencies). Not modelled, because
``ModelSpec`` does not describe it: Qwen2's ``max_window_layers``.
"""

from __future__ import annotations

import math

import numpy as np

from wse_emu.model import ModelSpec


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """weight * x / rms(x), over the last axis."""
    return weight * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps))


def silu(x: np.ndarray) -> np.ndarray:
    """x * sigmoid(x), with sigmoid(x) written as (1 + tanh(x / 2)) / 2 so it cannot overflow."""
    return x * (0.5 * (1.0 + np.tanh(0.5 * x)))


def softmax(x: np.ndarray) -> np.ndarray:
    """Over the last axis; -inf entries get probability zero."""
    e = np.exp(x - np.max(x, axis=-1, keepdims=True))
    return e / np.sum(e, axis=-1, keepdims=True)


def rotate_half(x: np.ndarray) -> np.ndarray:
    """Hugging Face's pairing: element i rotates with element i + head_dim / 2 (not i + 1)."""
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def rope_frequencies(spec: ModelSpec) -> np.ndarray:
    """Inverse frequencies, one per feature pair, step by step as Hugging Face's default,
    linear and llama3 rope initializations compute them."""
    dim = spec.head_dim
    inv_freq = 1.0 / spec.rope_theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    if spec.rope_scaling == "linear":
        return inv_freq / spec.rope_scaling_factor
    if spec.rope_scaling != "llama3":
        assert spec.rope_scaling is None, spec.rope_scaling
        return inv_freq
    factor = spec.rope_scaling_factor
    old_context = spec.rope_original_max_positions
    low_wavelen = old_context / spec.rope_low_freq_factor
    high_wavelen = old_context / spec.rope_high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - spec.rope_low_freq_factor) / (
        spec.rope_high_freq_factor - spec.rope_low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, smoothed, scaled)


def apply_rope(x: np.ndarray, positions: np.ndarray, inv_freq: np.ndarray) -> np.ndarray:
    """Rotate x (tokens, heads, head_dim) by the absolute position of each token.

    Angles are computed in float64 and rounded to x's dtype once; Hugging Face computes them in
    float32, which differs from this by float32 rounding (growing with the position).
    """
    angles = np.outer(np.asarray(positions, dtype=np.float64), inv_freq)
    angles = np.concatenate([angles, angles], axis=-1)  # (tokens, head_dim), as HF's `emb`
    cos = np.cos(angles).astype(x.dtype)[:, None, :]
    sin = np.sin(angles).astype(x.dtype)[:, None, :]
    return x * cos + rotate_half(x) * sin


class ReferenceModel:
    def __init__(self, spec: ModelSpec, weights: dict[str, np.ndarray], dtype=np.float64):
        self.spec = spec
        self.dtype = np.dtype(dtype)
        self.w = {name: np.asarray(array, dtype=self.dtype) for name, array in weights.items()}
        head = "model.embed_tokens.weight" if spec.tie_embeddings else "lm_head.weight"
        self.lm_head = self.w[head]
        self.reset()

    def reset(self) -> None:
        """Forget the sequence: empty KV caches, (tokens, kv_heads, head_dim) per layer."""
        empty = np.zeros((0, self.spec.num_kv_heads, self.spec.head_dim), dtype=self.dtype)
        self.keys = [empty] * self.spec.num_layers
        self.values = [empty] * self.spec.num_layers

    @property
    def length(self) -> int:
        """Tokens in the KV cache: the position the next token takes."""
        return len(self.keys[0])

    def prefill(self, ids) -> np.ndarray:
        """Start a new sequence; logits (len(ids), vocab) of every position."""
        self.reset()
        return self.forward(ids)

    def decode(self, next_id: int) -> np.ndarray:
        """Append one token; its logits (vocab,)."""
        return self.forward([next_id])[0]

    def forward(self, ids) -> np.ndarray:
        """Append tokens after those already cached; their logits (len(ids), vocab)."""
        spec = self.spec
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        positions = np.arange(self.length, self.length + len(ids))
        x = self.w["model.embed_tokens.weight"][ids]
        for layer in range(spec.num_layers):
            p = f"model.layers.{layer}."
            x = x + self._attention(layer, rms_norm(x, self.w[p + "input_layernorm.weight"],
                                                    spec.rms_norm_eps), positions)
            x = x + self._mlp(layer, rms_norm(x, self.w[p + "post_attention_layernorm.weight"],
                                              spec.rms_norm_eps))
        x = rms_norm(x, self.w["model.norm.weight"], spec.rms_norm_eps)
        return x @ self.lm_head.T

    def _linear(self, x: np.ndarray, module: str, bias: bool = False) -> np.ndarray:
        y = x @ self.w[module + ".weight"].T
        return y + self.w[module + ".bias"] if bias else y

    def _attention(self, layer: int, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
        spec = self.spec
        p = f"model.layers.{layer}.self_attn."
        n, bias = len(x), spec.attention_bias
        q = self._linear(x, p + "q_proj", bias).reshape(n, spec.num_heads, spec.head_dim)
        k = self._linear(x, p + "k_proj", bias).reshape(n, spec.num_kv_heads, spec.head_dim)
        v = self._linear(x, p + "v_proj", bias).reshape(n, spec.num_kv_heads, spec.head_dim)
        inv_freq = rope_frequencies(spec)
        q = apply_rope(q, positions, inv_freq)
        k = apply_rope(k, positions, inv_freq)  # cached after rotation, as in HF
        self.keys[layer] = keys = np.concatenate([self.keys[layer], k])
        self.values[layer] = values = np.concatenate([self.values[layer], v])

        key_positions = np.arange(len(keys))
        visible = key_positions[None, :] <= positions[:, None]  # causal
        if spec.sliding_window is not None:
            visible &= positions[:, None] - key_positions[None, :] < spec.sliding_window
        out = np.empty((n, spec.num_heads, spec.head_dim), dtype=self.dtype)
        for head in range(spec.num_heads):
            kv = head // spec.group_size  # HF's repeat_kv: consecutive query heads share a KV head
            scores = q[:, head] @ keys[:, kv].T / math.sqrt(spec.head_dim)
            out[:, head] = softmax(np.where(visible, scores, -np.inf)) @ values[:, kv]
        return self._linear(out.reshape(n, spec.q_size), p + "o_proj")

    def _mlp(self, layer: int, x: np.ndarray) -> np.ndarray:
        p = f"model.layers.{layer}.mlp."
        gated = silu(self._linear(x, p + "gate_proj")) * self._linear(x, p + "up_proj")
        return self._linear(gated, p + "down_proj")
