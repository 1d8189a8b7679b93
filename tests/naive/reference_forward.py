"""A plain-numpy forward pass of the supported decoder families, for tests.

The yardstick the functional engine is checked against, so it is written to be read, not to be
fast: each step is the formula of Hugging Face's modeling code for the family. Weights are the
Hugging Face-named arrays of a checkpoint; linear weights are (out, in).

The Llama family (Llama, Mistral, Qwen2) is the base: pre-norm RMSNorm decoder layers, rotary
embeddings with the rotate_half convention, grouped-query attention with a causal mask, a
SiLU-gated MLP, a final norm and an LM head, tied to the embedding or not. The other families
differ from it only where their ``ModelSpec`` fields say:

- Qwen3: an RMSNorm over each head's query and key features (``q_norm``, ``k_norm``) between the
  projections and the rotation (``qk_norm``).
- Gemma-2: embeddings times sqrt(hidden_size) (``scale_embeddings``); norms scale by (1 + w)
  (``norm_weight_offset``); the attention and MLP outputs are normalized again before their
  residual adds (``sandwich_norms``: ``post_attention_layernorm`` is that output norm, and
  ``pre_feedforward_layernorm`` takes the place Llama's ``post_attention_layernorm`` has); a
  GeGLU MLP with tanh-approximated GELU (``hidden_act``); scores scaled by
  ``query_pre_attn_scalar`` ** -1/2 and soft-capped, cap * tanh(s / cap), as are the final logits;
  sliding-window and full layers alternating (``layer_types``).
- Gemma-3 (text): Gemma-2 with Gemma-style q/k norms and a rope base per layer kind (sliding
  layers: ``rope_local_theta``, unscaled), usually without soft-capping.
- Phi-3: one fused ``qkv_proj`` (rows q, k, v) and one fused ``gate_up_proj`` (rows gate, up),
  and "longrope" rotary scaling (below).
- Mixtral and Qwen3-MoE: the MLP is ``num_experts`` SiLU-gated experts; the router's softmax
  over all of them picks each token's top ``experts_per_token``, whose probabilities are
  renormalized to sum to one (Mixtral always, Qwen3-MoE with ``norm_topk_prob``) and weigh the
  experts' outputs. Qwen3-MoE's attention is Qwen3's.
- gpt-oss: the router (with a bias) picks the top-k logits and takes their softmax; each expert
  (biased, weights stored (in, out), gate and up interleaved in one ``gate_up_proj``) computes
  ``(up + 1) * gate * sigmoid(1.702 * gate)`` with the gate clamped above and the up value on
  both sides at ``swiglu_limit``; every head's softmax over keys also holds a learned logit,
  its "sink", which takes probability and gives no value; q, k, v and o have biases.

Experts are read in the layout the Hub's checkpoints store them (the family's row
in ``wse_emu.models.families``: ``expert_tensors``): one tensor per expert and projection for
Mixtral and Qwen3-MoE, one per projection for all experts for gpt-oss.

A ``ReferenceModel`` holds one sequence's KV cache: ``prefill(ids)`` starts a sequence and returns
the logits of every position, ``decode(next_id)`` appends one token and returns its logits, and
``forward(ids)`` appends several (a chunk of a chunked prefill).

Rope scaling of the ``linear``, ``llama3``, ``longrope`` and ``yarn`` types is applied as
Hugging Face's ``modeling_rope_utils`` computes it. Longrope picks its frequencies per call, as
Hugging Face's dynamic update does: the long ones when the call's largest position + 1 exceeds
``rope_original_max_positions``. Keys are cached after rotation (as in Hugging Face's cache), so
keys cached by an earlier, shorter call keep the short frequencies; recomputing the whole sequence
in one call would rotate them with the long ones and give other logits.

Sliding windows: position q sees key position k when q - window < k <= q, the test of Hugging
Face's ``masking_utils`` for every family here (Mistral, Qwen2/3, Gemma-2/3 and Phi-3 alike).

Every step computes in the model's dtype. Where Hugging Face upcasts (norms and the softmax in
float32, angles in float32) the float64 reference differs from it by float32 rounding only.
Not modelled, because ``ModelSpec`` does not describe it: a ``partial_rotary_factor`` below one
(Phi-4-mini). Qwen2/3's ``max_window_layers`` reaches the reference through ``layer_types``.
Hugging Face's Gemma-3 passes no cap to its attention, so a Gemma-3 spec has no
``attn_logit_softcap`` (if one were set, the reference would apply it).
"""

from __future__ import annotations

import math

import numpy as np

from wse_emu.models.spec import ModelSpec

SWIGLU_ALPHA = 1.702  # gpt-oss's sigmoid slope in its SwiGLU (a constant of its code)


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float, offset: float = 0.0) -> np.ndarray:
    """(offset + weight) * x / rms(x), over the last axis. Gemma stores its norm weights as
    deviations from one (offset 1), the others store the scale itself (offset 0)."""
    return (offset + weight) * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps))


def silu(x: np.ndarray) -> np.ndarray:
    """x * sigmoid(x), with sigmoid(x) written as (1 + tanh(x / 2)) / 2 so it cannot overflow."""
    return x * (0.5 * (1.0 + np.tanh(0.5 * x)))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GELU with the tanh approximation (PyTorch's approximate="tanh", Gemma's activation)."""
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))


ACTIVATIONS = {"silu": silu, "gelu_tanh": gelu_tanh}


def softcap(x: np.ndarray, cap: float | None) -> np.ndarray:
    """cap * tanh(x / cap): about x for |x| << cap, never beyond +-cap. None: x unchanged."""
    return x if cap is None else cap * np.tanh(x / cap)


def softmax(x: np.ndarray) -> np.ndarray:
    """Over the last axis; -inf entries get probability zero."""
    e = np.exp(x - np.max(x, axis=-1, keepdims=True))
    return e / np.sum(e, axis=-1, keepdims=True)


def rotate_half(x: np.ndarray) -> np.ndarray:
    """Hugging Face's pairing: element i rotates with element i + head_dim / 2 (not i + 1)."""
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def rope_frequencies(spec: ModelSpec, layer: int | None = None,
                     seq_len: int | None = None) -> np.ndarray:
    """Inverse frequencies, one per feature pair, step by step as Hugging Face's default,
    linear, llama3 and longrope initializations compute them.

    ``layer`` picks the layer's rope base and whether it is scaled (Gemma-3's sliding layers have
    a local, unscaled base); None means the model-wide base and scaling. ``seq_len`` is what
    longrope chooses its factors by (None: the short ones, as Hugging Face's initialization).
    """
    dim = spec.attention.head_dim
    theta = spec.rope.theta if layer is None else spec.rope_theta_of(layer)
    scaling = spec.rope.scaling if layer is None or spec.rope_scaled(layer) else None
    inv_freq = 1.0 / theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    if scaling == "linear":
        return inv_freq / spec.rope.factor
    if scaling == "yarn":
        return _yarn_frequencies(spec, inv_freq)
    if scaling == "longrope":
        # Strictly beyond the original context uses the long factors; up to it, the short ones.
        long = seq_len is not None and seq_len > spec.rope.original_max_positions
        factors = spec.rope.long_factor if long else spec.rope.short_factor
        return inv_freq / np.asarray(factors, dtype=np.float64)
    if scaling != "llama3":
        assert scaling is None, scaling
        return inv_freq
    factor = spec.rope.factor
    old_context = spec.rope.original_max_positions
    low_wavelen = old_context / spec.rope.low_freq_factor
    high_wavelen = old_context / spec.rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - spec.rope.low_freq_factor) / (
        spec.rope.high_freq_factor - spec.rope.low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, smoothed, scaled)


def _yarn_frequencies(spec: ModelSpec, inv_freq: np.ndarray) -> np.ndarray:
    """YaRN: each pair's frequency blends the original (extrapolated) one and the one divided
    by the factor (interpolated), by how many turns the pair makes over the original context:
    more than beta_fast, kept; fewer than beta_slow, divided; a linear ramp between."""
    dim, base = spec.attention.head_dim, spec.rope.theta
    original = spec.rope.original_max_positions

    def pair_turning(turns: float) -> float:  # the pair index making ``turns`` turns
        return dim * math.log(original / (turns * 2 * math.pi)) / (2 * math.log(base))

    low, high = pair_turning(spec.rope.beta_fast), pair_turning(spec.rope.beta_slow)
    if spec.rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    keep = 1 - ramp  # 1: the original frequency, 0: divided by the factor
    return inv_freq / spec.rope.factor * (1 - keep) + inv_freq * keep


def rope_attention_factor(spec: ModelSpec, layer: int | None = None) -> float:
    """What cos and sin are multiplied by: 1 but for longrope, whose factor is given or, as
    Hugging Face derives it from how far the context was stretched,
    sqrt(1 + log(scale) / log(original)) with scale = max_position_embeddings / original."""
    scaled = layer is None or spec.rope_scaled(layer)
    if scaled and spec.rope.scaling == "yarn":
        if spec.rope.attention_factor is not None:
            return spec.rope.attention_factor
        factor = spec.rope.factor
        return 1.0 if factor <= 1 else 0.1 * math.log(factor) + 1.0
    if not scaled or spec.rope.scaling != "longrope":
        return 1.0
    if spec.rope.attention_factor is not None:
        return spec.rope.attention_factor
    original = spec.rope.original_max_positions
    scale = spec.max_position_embeddings / original
    return 1.0 if scale <= 1.0 else math.sqrt(1 + math.log(scale) / math.log(original))


def apply_rope(x: np.ndarray, positions: np.ndarray, inv_freq: np.ndarray,
               scale: float = 1.0) -> np.ndarray:
    """Rotate x (tokens, heads, head_dim) by the absolute position of each token, with cos and
    sin multiplied by ``scale`` (longrope's attention factor).

    Angles are computed in float64 and rounded to x's dtype once; Hugging Face computes them in
    float32, which differs from this by float32 rounding (growing with the position).
    """
    angles = np.outer(np.asarray(positions, dtype=np.float64), inv_freq)
    angles = np.concatenate([angles, angles], axis=-1)  # (tokens, head_dim), as HF's `emb`
    cos = (np.cos(angles) * scale).astype(x.dtype)[:, None, :]
    sin = (np.sin(angles) * scale).astype(x.dtype)[:, None, :]
    return x * cos + rotate_half(x) * sin


class ReferenceModel:
    def __init__(self, spec: ModelSpec, weights: dict[str, np.ndarray], dtype=np.float64):
        self.spec = spec
        self.dtype = np.dtype(dtype)
        self.w = {name: np.asarray(array, dtype=self.dtype) for name, array in weights.items()}
        head = "model.embed_tokens.weight" if spec.tie_embeddings else "lm_head.weight"
        self.lm_head = self.w[head]
        self.activation = ACTIVATIONS[spec.mlp.activation]
        self.reset()

    def reset(self) -> None:
        """Forget the sequence: empty KV caches, (tokens, kv_heads, head_dim) per layer."""
        empty = np.zeros((0, self.spec.attention.num_kv_heads, self.spec.attention.head_dim),
                         dtype=self.dtype)
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
        if spec.scale_embeddings:
            # Hugging Face rounds the normalizer to the hidden states' dtype first (in bfloat16,
            # sqrt(3072) becomes 55.5), so it is rounded to ours.
            x = x * np.asarray(math.sqrt(spec.hidden_size), dtype=self.dtype)
        for layer in range(spec.num_layers):
            p = f"model.layers.{layer}."
            attended = self._attention(layer, self._norm(x, p + "input_layernorm"), positions)
            if spec.norm.sandwich:
                # Gemma's names: post_attention_layernorm normalizes the attention output, and
                # pre_feedforward_layernorm is the MLP's input norm.
                attended = self._norm(attended, p + "post_attention_layernorm")
                x = x + attended
                mlp = self._mlp(layer, self._norm(x, p + "pre_feedforward_layernorm"))
                x = x + self._norm(mlp, p + "post_feedforward_layernorm")
            else:
                x = x + attended
                x = x + self._mlp(layer, self._norm(x, p + "post_attention_layernorm"))
        x = self._norm(x, "model.norm")
        return softcap(x @ self.lm_head.T, spec.final_logit_softcap)

    def _norm(self, x: np.ndarray, module: str) -> np.ndarray:
        return rms_norm(x, self.w[module + ".weight"], self.spec.norm.eps,
                        self.spec.norm.weight_offset)

    def _linear(self, x: np.ndarray, module: str, bias: bool = False) -> np.ndarray:
        y = x @ self.w[module + ".weight"].T
        return y + self.w[module + ".bias"] if bias else y

    def _qkv(self, layer: int, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The query, key and value projections, flat: (tokens, q_size), (tokens, kv_size) x 2."""
        spec = self.spec
        p = f"model.layers.{layer}.self_attn."
        if "self_attn.qkv_proj" in spec.family_record.fused:
            # One fused matrix whose output rows are q, then k, then v (no biases in Phi-3).
            qkv = self._linear(x, p + "qkv_proj")
            q_end = spec.attention.q_size
            k_end = q_end + spec.attention.kv_size
            return qkv[:, :q_end], qkv[:, q_end:k_end], qkv[:, k_end:]
        bias = spec.attention.bias
        return (self._linear(x, p + "q_proj", bias), self._linear(x, p + "k_proj", bias),
                self._linear(x, p + "v_proj", bias))

    def _attention(self, layer: int, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
        spec = self.spec
        p = f"model.layers.{layer}.self_attn."
        n = len(x)
        q, k, v = self._qkv(layer, x)
        q = q.reshape(n, spec.attention.num_heads, spec.attention.head_dim)
        k = k.reshape(n, spec.attention.num_kv_heads, spec.attention.head_dim)
        v = v.reshape(n, spec.attention.num_kv_heads, spec.attention.head_dim)
        if spec.attention.qk_norm:
            # Over each head's head_dim features, before the rotation; values are not normalized.
            q = self._norm(q, p + "q_norm")
            k = self._norm(k, p + "k_norm")
        # Longrope decides short or long by the whole call: its largest position + 1.
        inv_freq = rope_frequencies(spec, layer, seq_len=len(self.keys[layer]) + n)
        scale = rope_attention_factor(spec, layer)
        q = apply_rope(q, positions, inv_freq, scale)
        k = apply_rope(k, positions, inv_freq, scale)  # cached after rotation, as in HF
        self.keys[layer] = keys = np.concatenate([self.keys[layer], k])
        self.values[layer] = values = np.concatenate([self.values[layer], v])

        key_positions = np.arange(len(keys))
        visible = key_positions[None, :] <= positions[:, None]  # causal
        window = spec.attention.window(layer)
        if window is not None:
            visible &= positions[:, None] - key_positions[None, :] < window
        out = np.empty((n, spec.attention.num_heads, spec.attention.head_dim), dtype=self.dtype)
        for head in range(spec.attention.num_heads):
            # HF's repeat_kv: consecutive query heads share a KV head.
            kv = head // spec.attention.group_size
            scores = q[:, head] @ keys[:, kv].T * np.asarray(spec.attention.scale, self.dtype)
            # Scale, then cap, then mask: the order of Hugging Face's eager attention.
            scores = softcap(scores, spec.attention.logit_softcap)
            scores = np.where(visible, scores, -np.inf)
            if spec.attention.sinks:
                # The sink joins each query's softmax as one more logit, then is dropped.
                sink = np.full((n, 1), self.w[p + "sinks"][head], dtype=self.dtype)
                weights = softmax(np.concatenate([scores, sink], axis=-1))[:, :-1]
            else:
                weights = softmax(scores)
            out[:, head] = weights @ values[:, kv]
        return self._linear(out.reshape(n, spec.attention.q_size), p + "o_proj",
                            spec.attention.o_proj_bias)

    def _mlp(self, layer: int, x: np.ndarray) -> np.ndarray:
        spec = self.spec
        if spec.is_moe:
            return self._experts(layer, x)
        p = f"model.layers.{layer}.mlp."
        if "mlp.gate_up_proj" in spec.family_record.fused:
            # One fused matrix whose output rows are the gate's, then the up projection's.
            gate_up = self._linear(x, p + "gate_up_proj")
            gate, up = gate_up[:, :spec.mlp.intermediate_size], gate_up[:,
                                                                        spec.mlp.intermediate_size:]
        else:
            gate, up = self._linear(x, p + "gate_proj"), self._linear(x, p + "up_proj")
        return self._linear(self.activation(gate) * up, p + "down_proj")

    def _route(self, layer: int, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each token's chosen experts (tokens, k) and their weights (tokens, k)."""
        spec = self.spec
        router = f"model.layers.{layer}.{spec.family_record.expert_tensors[0]}"
        logits = self._linear(x, router, spec.experts.router_bias)
        k = spec.experts.top_k
        if spec.family_record.softmax_after_topk:
            chosen = np.argsort(-logits, axis=-1, kind="stable")[:, :k]
            return chosen, softmax(np.take_along_axis(logits, chosen, axis=-1))
        probs = softmax(logits)
        chosen = np.argsort(-probs, axis=-1, kind="stable")[:, :k]
        weights = np.take_along_axis(probs, chosen, axis=-1)
        if spec.experts.norm_topk_prob:
            weights = weights / weights.sum(axis=-1, keepdims=True)
        return chosen, weights

    def _expert(self, layer: int, expert: int, x: np.ndarray) -> np.ndarray:
        """One expert's MLP on the tokens ``x`` routed to it."""
        spec = self.spec
        p = f"model.layers.{layer}."
        _, gate_name, up_name, down_name = spec.family_record.expert_tensors
        if spec.family_record.experts_stored_together:
            gate_up = x @ self.w[p + gate_name][expert] + self.w[p + gate_name + "_bias"][expert]
            gate, up = gate_up[:, ::2], gate_up[:, 1::2]  # interleaved columns
            gate = np.minimum(gate, spec.experts.swiglu_limit)
            up = np.clip(up, -spec.experts.swiglu_limit, spec.experts.swiglu_limit)
            glu = gate * (0.5 * (1.0 + np.tanh(0.5 * SWIGLU_ALPHA * gate)))
            return ((up + 1) * glu) @ self.w[p + down_name][expert] \
                + self.w[p + down_name + "_bias"][expert]
        name = (p + gate_name).format(e=expert), (p + up_name).format(e=expert)
        hidden = self.activation(self._linear(x, name[0])) * self._linear(x, name[1])
        return self._linear(hidden, (p + down_name).format(e=expert))

    def _experts(self, layer: int, x: np.ndarray) -> np.ndarray:
        """Each token through its top-k experts, their outputs weighted and summed."""
        chosen, weights = self._route(layer, x)
        out = np.zeros_like(x)
        for expert in np.unique(chosen):
            tokens, slot = np.nonzero(chosen == expert)
            out[tokens] += weights[tokens, slot, None] * self._expert(layer, int(expert),
                                                                      x[tokens])
        return out
