"""The plain-numpy reference forward pass: hand-computed answers and its own invariants."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from reference_forward import ReferenceModel, apply_rope, rotate_half

from wse_emu.model import ModelSpec
from wse_emu.weights import random_weights

GQA = ModelSpec(name="gqa", family="llama", hidden_size=16, intermediate_size=24, num_layers=2,
                num_heads=4, num_kv_heads=2, head_dim=6, vocab_size=32).validate("test")
MHA = dataclasses.replace(GQA, name="mha", num_kv_heads=4)
MQA = dataclasses.replace(GQA, name="mqa", num_kv_heads=1)
QWEN2 = dataclasses.replace(GQA, name="qwen2", family="qwen2", attention_bias=True,
                            tie_embeddings=True, rms_norm_eps=1e-6, rope_theta=1e6)
MISTRAL = dataclasses.replace(GQA, name="mistral", family="mistral", sliding_window=4)
SPECS = [GQA, MHA, MQA, QWEN2, MISTRAL]
TOKENS = [3, 17, 0, 31, 9, 9, 22, 5, 14, 1]


def model(spec, dtype=np.float64, seed=0):
    return ReferenceModel(spec, random_weights(spec, seed), dtype)


# --- a hand-checkable model -----------------------------------------------------------------

def sigmoid(x):
    return 1.0 / (1.0 + math.exp(-x))


def silu(x):
    return x * sigmoid(x)


def normalized(v, weight=(1, 1, 1, 1)):
    """RMSNorm with eps 0."""
    rms = math.sqrt(sum(x * x for x in v) / len(v))
    return [w * x / rms for w, x in zip(weight, v)]


def rotated(v, position, theta=100.0):
    """Hugging Face's RoPE on head_dim 4: pair (0, 2) turns by position * 1, pair (1, 3) by
    position * theta ** -0.5."""
    out = list(v)
    for i in (0, 1):
        angle = position * theta ** (-2 * i / 4)
        c, s = math.cos(angle), math.sin(angle)
        out[i], out[i + 2] = v[i] * c - v[i + 2] * s, v[i + 2] * c + v[i] * s
    return out


def add(a, b):
    return [x + y for x, y in zip(a, b)]


HAND = ModelSpec(name="hand", family="qwen2", hidden_size=4, intermediate_size=2, num_layers=1,
                 num_heads=1, num_kv_heads=1, head_dim=4, vocab_size=4, attention_bias=True,
                 rms_norm_eps=0.0, rope_theta=100.0)
EMBED = [[2, -2, 2, -2], [1, 1, 1, 1], [0, 3, 0, 4], [1, 0, 0, 0]]
Q_BIAS = [0, 0.5, 0, 0]
K_BIAS = [0.25, 0, 0, 0.5]
V_BIAS = [0, 0, 0, 1]
FINAL_NORM = [1, 0.5, 2, 1]


def hand_weights():
    eye = np.eye(4)
    return {
        "model.embed_tokens.weight": np.array(EMBED, float),
        "model.layers.0.input_layernorm.weight": np.ones(4),
        "model.layers.0.self_attn.q_proj.weight": eye,
        "model.layers.0.self_attn.q_proj.bias": np.array(Q_BIAS),
        "model.layers.0.self_attn.k_proj.weight": eye,
        "model.layers.0.self_attn.k_proj.bias": np.array(K_BIAS),
        "model.layers.0.self_attn.v_proj.weight": eye,
        "model.layers.0.self_attn.v_proj.bias": np.array(V_BIAS),
        "model.layers.0.self_attn.o_proj.weight": eye,
        "model.layers.0.post_attention_layernorm.weight": np.ones(4),
        # gate reads x0, x1; up reads x0, x2; down writes m0, m1 to h0, h1.
        "model.layers.0.mlp.gate_proj.weight": np.array([[1, 0, 0, 0], [0, 1, 0, 0]], float),
        "model.layers.0.mlp.up_proj.weight": np.array([[1, 0, 0, 0], [0, 0, 1, 0]], float),
        "model.layers.0.mlp.down_proj.weight": np.array([[1, 0], [0, 1], [0, 0], [0, 0]], float),
        "model.norm.weight": np.array(FINAL_NORM, float),
        "lm_head.weight": eye,  # logits are the final normalized hidden state
    }


def test_hand_checked_first_token():
    # x = [2, -2, 2, -2] has rms 2. Attention over the token itself returns its value,
    # n + v_bias = [1, -1, 1, 0], so h = [3, -3, 3, -2]; normalized to m (rms sqrt(31 / 4)), the
    # MLP adds silu(m0) * m0 and silu(m1) * m2 to h0 and h1.
    logits = ReferenceModel(HAND, hand_weights()).prefill([0])[0]
    m = [x / math.sqrt(31 / 4) for x in (3, -3, 3, -2)]
    h = [3 + silu(m[0]) * m[0], -3 + silu(m[1]) * m[2], 3, -2]
    np.testing.assert_allclose(logits, normalized(h, FINAL_NORM), rtol=1e-12)


def test_hand_checked_two_tokens():
    logits = ReferenceModel(HAND, hand_weights()).prefill([0, 2])
    x = [EMBED[0], EMBED[2]]
    n = [normalized(v) for v in x]
    q = [rotated(add(n[p], Q_BIAS), p) for p in (0, 1)]  # bias first, then the rotation
    k = [rotated(add(n[p], K_BIAS), p) for p in (0, 1)]
    v = [add(n[p], V_BIAS) for p in (0, 1)]
    expected = []
    for p in (0, 1):
        scores = [sum(a * b for a, b in zip(q[p], k[j])) / 2 for j in range(p + 1)]  # / sqrt(4)
        weights = [math.exp(s) / sum(math.exp(t) for t in scores) for s in scores]
        attended = [sum(w * v[j][i] for j, w in enumerate(weights)) for i in range(4)]
        h = add(x[p], attended)
        m = normalized(h)
        mlp = [silu(m[0]) * m[0], silu(m[1]) * m[2], 0, 0]
        expected.append(normalized(add(h, mlp), FINAL_NORM))
    np.testing.assert_allclose(logits, expected, rtol=1e-12, atol=1e-12)


# --- rotary embeddings ----------------------------------------------------------------------

def frequencies(x: np.ndarray, theta: float) -> np.ndarray:
    """Unscaled inverse frequencies for x's head size."""
    dim = x.shape[-1]
    return 1.0 / theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)


def test_rope_at_position_zero_is_the_identity():
    x = np.random.default_rng(0).standard_normal((1, 3, 8))
    np.testing.assert_array_equal(apply_rope(x, np.array([0]), frequencies(x, 10000.0)), x)


def test_rope_rotates_pairs_half_a_head_apart():
    assert rotate_half(np.array([1.0, 2.0, 3.0, 4.0])).tolist() == [-3.0, -4.0, 1.0, 2.0]
    x = np.zeros((1, 1, 4))
    x[0, 0, 0] = 1.0  # turns towards element 2, by one radian per position at frequency 1
    out = apply_rope(x, np.array([1]), frequencies(x, 100.0))[0, 0]
    np.testing.assert_allclose(out, [math.cos(1), 0, math.sin(1), 0], atol=1e-15)


def test_rope_scores_depend_only_on_relative_position():
    rng = np.random.default_rng(1)
    q, k = rng.standard_normal((2, 1, 1, 8))

    def score(m, n):
        return float(np.sum(apply_rope(q, np.array([m]), frequencies(q, 500.0))
                            * apply_rope(k, np.array([n]), frequencies(k, 500.0))))

    assert score(7, 3) == pytest.approx(score(104, 100), rel=1e-9)
    assert score(7, 3) != pytest.approx(score(8, 3), rel=1e-3)
    rotated = apply_rope(q, np.array([1000]), frequencies(q, 500.0))
    norms = np.linalg.norm(rotated), np.linalg.norm(q)
    assert norms[0] == pytest.approx(norms[1])


# --- invariants of the whole pass -----------------------------------------------------------

@pytest.mark.parametrize("dtype, tolerance", [(np.float64, 1e-10), (np.float32, 1e-5)])
@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_decode_step_by_step_equals_prefill(spec, dtype, tolerance):
    reference = model(spec, dtype)
    full = reference.prefill(TOKENS)
    assert full.shape == (len(TOKENS), spec.vocab_size) and full.dtype == dtype
    first = reference.prefill(TOKENS[:3])
    steps = [*first] + [reference.decode(t) for t in TOKENS[3:]]
    assert reference.length == len(TOKENS)
    np.testing.assert_allclose(np.array(steps), full, rtol=tolerance, atol=tolerance)
    assert np.abs(full).max() < 20  # random weights keep logits O(1)


def test_chunked_prefill_equals_prefill():
    reference = model(QWEN2)
    full = reference.prefill(TOKENS)
    reference.reset()
    chunks = [reference.forward(TOKENS[:4]), reference.forward(TOKENS[4:7]),
              reference.forward(TOKENS[7:])]
    np.testing.assert_allclose(np.concatenate(chunks), full, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_causal_a_later_token_does_not_change_earlier_logits(spec):
    reference = model(spec)
    before = reference.prefill(TOKENS)
    after = reference.prefill(TOKENS[:5] + [(t + 1) % spec.vocab_size for t in TOKENS[5:]])
    np.testing.assert_allclose(after[:5], before[:5], rtol=1e-12, atol=1e-12)
    assert not np.allclose(after[5], before[5])


def test_sliding_window_hides_tokens_that_fell_out_of_it():
    # One layer, so position p sees exactly tokens p - 3 .. p (window 4).
    spec = dataclasses.replace(MISTRAL, num_layers=1)
    reference = model(spec)
    before = reference.prefill(TOKENS)
    after = reference.prefill([TOKENS[0] + 1] + TOKENS[1:])
    assert not np.allclose(after[3], before[3])
    np.testing.assert_allclose(after[4:], before[4:], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kv_heads", [1, 2])
def test_grouped_query_attention_equals_attention_with_repeated_kv_heads(kv_heads):
    gqa = dataclasses.replace(MHA, num_kv_heads=kv_heads)
    weights = random_weights(gqa, seed=2, dtype=np.float64)
    # Query head h reads KV head h // group: repeat each KV head's rows group times, in place.
    mha_weights = dict(weights)
    for layer in range(gqa.num_layers):
        for proj in ("k_proj", "v_proj"):
            name = f"model.layers.{layer}.self_attn.{proj}.weight"
            per_head = weights[name].reshape(kv_heads, gqa.head_dim, gqa.hidden_size)
            mha_weights[name] = np.repeat(per_head, gqa.group_size, axis=0).reshape(
                MHA.kv_size, gqa.hidden_size)
    expected = ReferenceModel(MHA, mha_weights).prefill(TOKENS)
    np.testing.assert_allclose(ReferenceModel(gqa, weights).prefill(TOKENS), expected,
                               rtol=1e-12, atol=1e-12)


def test_tied_head_is_the_embedding():
    tied = dataclasses.replace(GQA, tie_embeddings=True)
    weights = random_weights(tied, seed=3, dtype=np.float64)
    untied = {**weights, "lm_head.weight": weights["model.embed_tokens.weight"]}
    np.testing.assert_array_equal(ReferenceModel(tied, weights).prefill(TOKENS),
                                  ReferenceModel(GQA, untied).prefill(TOKENS))
