"""The plain-numpy reference forward pass: hand-computed answers and its own invariants."""

from __future__ import annotations

import math

import numpy as np
import pytest
from naive.reference_forward import (
    ReferenceModel,
    apply_rope,
    gelu_tanh,
    rms_norm,
    rope_attention_factor,
    rope_frequencies,
    rotate_half,
    softcap,
)

from wse_emu.models.spec import ModelSpec
from wse_emu.models.weights import random_weights

GQA = ModelSpec.from_fields(name="gqa", family="llama", hidden_size=16, intermediate_size=24,
                            num_layers=2,
                            num_heads=4, num_kv_heads=2, head_dim=6, vocab_size=32).validate("test")
MHA = GQA.replaced(name="mha", num_kv_heads=4)
MQA = GQA.replaced(name="mqa", num_kv_heads=1)
QWEN2 = GQA.replaced(name="qwen2", family="qwen2", attention_bias=True,
                     tie_embeddings=True, rms_norm_eps=1e-6, rope_theta=1e6)
MISTRAL = GQA.replaced(name="mistral", family="mistral", sliding_window=4)
QWEN3 = GQA.replaced(name="qwen3", family="qwen3", qk_norm=True, head_dim=8,
                     rms_norm_eps=1e-6).validate("test")
_GEMMA = dict(sandwich_norms=True, norm_weight_offset=1.0, scale_embeddings=True,
              hidden_act="gelu_tanh", tie_embeddings=True, sliding_window=3,
              layer_types=("sliding_attention", "full_attention"))
GEMMA2 = GQA.replaced(name="gemma2", family="gemma2", attn_logit_softcap=5.0,
                      final_logit_softcap=8.0, query_pre_attn_scalar=8.0,
                      **_GEMMA).validate("test")
GEMMA3 = GQA.replaced(name="gemma3", family="gemma3", qk_norm=True,
                      query_pre_attn_scalar=6.0, rope_theta=1e6, rope_local_theta=1e4,
                      rope_scaling="linear", rope_scaling_factor=4.0,
                      **_GEMMA).validate("test")
# Longrope within its original context here (see the longrope tests for beyond it).
PHI3 = GQA.replaced(name="phi3", family="phi3", rope_scaling="longrope",
                    rope_original_max_positions=16, max_position_embeddings=64,
                    rope_short_factor=(1.0, 1.5, 3.0),
                    rope_long_factor=(2.0, 5.0, 9.0)).validate("test")
SPECS = [GQA, MHA, MQA, QWEN2, MISTRAL, QWEN3, GEMMA2, GEMMA3, PHI3]
TOKENS = [3, 17, 0, 31, 9, 9, 22, 5, 14, 1]


def family_weights(spec, seed=0):
    """Seeded Hugging Face-named weights for any family, sized as ``random_weights`` sizes them
    (O(1) activations; norm scales near one, Gemma's stored as deviations from one).
    The Llama family keeps ``random_weights`` itself."""
    if spec.family in ("llama", "mistral", "qwen2"):
        return random_weights(spec, seed, dtype=np.float64)
    h, i, layers = spec.hidden_size, spec.mlp.intermediate_size, spec.num_layers
    shapes = {"model.embed_tokens.weight": (spec.vocab_size, h), "model.norm.weight": (h,)}
    if not spec.tie_embeddings:
        shapes["lm_head.weight"] = (spec.vocab_size, h)
    for layer in range(layers):
        p = f"model.layers.{layer}."
        norms = ["input_layernorm", "post_attention_layernorm"]
        if spec.norm.sandwich:
            norms += ["pre_feedforward_layernorm", "post_feedforward_layernorm"]
        shapes.update({p + name + ".weight": (h,) for name in norms})
        if "self_attn.qkv_proj" in spec.family_record.fused:
            shapes[p + "self_attn.qkv_proj.weight"] = (
                spec.attention.q_size + 2 * spec.attention.kv_size, h)
            shapes[p + "mlp.gate_up_proj.weight"] = (2 * i, h)
        else:
            for proj, rows in (("q_proj", spec.attention.q_size), ("k_proj",
                                                                   spec.attention.kv_size),
                               ("v_proj", spec.attention.kv_size)):
                shapes[p + f"self_attn.{proj}.weight"] = (rows, h)
                if spec.attention.bias:
                    shapes[p + f"self_attn.{proj}.bias"] = (rows,)
            shapes[p + "mlp.gate_proj.weight"] = shapes[p + "mlp.up_proj.weight"] = (i, h)
        if spec.attention.qk_norm:
            shapes[p + "self_attn.q_norm.weight"] = (spec.attention.head_dim,)
            shapes[p + "self_attn.k_norm.weight"] = (spec.attention.head_dim,)
        shapes[p + "self_attn.o_proj.weight"] = (h, spec.attention.q_size)
        shapes[p + "mlp.down_proj.weight"] = (h, i)
    rng = np.random.default_rng(seed)
    weights = {}
    for name, shape in sorted(shapes.items()):
        noise = rng.standard_normal(shape)
        if name.endswith("norm.weight"):
            weights[name] = (1.0 - spec.norm.weight_offset) + 0.1 * noise
        elif name.endswith(".bias"):
            weights[name] = 0.1 * noise
        else:
            weights[name] = noise / math.sqrt(shape[1])
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                weights[name] /= math.sqrt(2 * layers)
    return weights


def model(spec, dtype=np.float64, seed=0):
    return ReferenceModel(spec, family_weights(spec, seed), dtype)


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


HAND = ModelSpec.from_fields(name="hand", family="qwen2", hidden_size=4, intermediate_size=2,
                             num_layers=1, num_heads=1, num_kv_heads=1, head_dim=4, vocab_size=4,
                             attention_bias=True, rms_norm_eps=0.0, rope_theta=100.0)
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
    spec = MISTRAL.replaced(num_layers=1)
    reference = model(spec)
    before = reference.prefill(TOKENS)
    after = reference.prefill([TOKENS[0] + 1] + TOKENS[1:])
    assert not np.allclose(after[3], before[3])
    np.testing.assert_allclose(after[4:], before[4:], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kv_heads", [1, 2])
def test_grouped_query_attention_equals_attention_with_repeated_kv_heads(kv_heads):
    gqa = MHA.replaced(num_kv_heads=kv_heads)
    weights = random_weights(gqa, seed=2, dtype=np.float64)
    # Query head h reads KV head h // group: repeat each KV head's rows group times, in place.
    mha_weights = dict(weights)
    for layer in range(gqa.num_layers):
        for proj in ("k_proj", "v_proj"):
            name = f"model.layers.{layer}.self_attn.{proj}.weight"
            per_head = weights[name].reshape(kv_heads, gqa.attention.head_dim, gqa.hidden_size)
            mha_weights[name] = np.repeat(per_head, gqa.attention.group_size, axis=0).reshape(
                MHA.attention.kv_size, gqa.hidden_size)
    expected = ReferenceModel(MHA, mha_weights).prefill(TOKENS)
    np.testing.assert_allclose(ReferenceModel(gqa, weights).prefill(TOKENS), expected,
                               rtol=1e-12, atol=1e-12)


def test_tied_head_is_the_embedding():
    tied = GQA.replaced(tie_embeddings=True)
    weights = random_weights(tied, seed=3, dtype=np.float64)
    untied = {**weights, "lm_head.weight": weights["model.embed_tokens.weight"]}
    np.testing.assert_array_equal(ReferenceModel(tied, weights).prefill(TOKENS),
                                  ReferenceModel(GQA, untied).prefill(TOKENS))


# --- the pieces of the newer families ---------------------------------------------------------

def test_gemma_norm_scales_by_one_plus_its_weight():
    x = np.array([[3.0, -1.0, 2.0, 0.5]])
    w = np.array([0.0, 0.5, -0.25, 2.0])
    plain = x / np.sqrt(np.mean(x * x))
    np.testing.assert_allclose(rms_norm(x, w, 0.0, offset=1.0), (1 + w) * plain, rtol=1e-15)
    np.testing.assert_allclose(rms_norm(x, np.zeros(4), 0.0, offset=1.0), plain, rtol=1e-15)
    np.testing.assert_allclose(rms_norm(x, w, 0.0), w * plain, rtol=1e-15)


def test_softcap_bounds_large_values_and_keeps_small_ones():
    x = np.array([-1e6, -30.0, -0.01, 0.0, 0.01, 30.0, 1e6])
    capped = softcap(x, 5.0)
    assert np.all(np.abs(capped) <= 5.0) and np.all(np.diff(capped) > 0)
    assert capped[-1] == pytest.approx(5.0) and capped[0] == pytest.approx(-5.0)
    np.testing.assert_allclose(capped[2:5], x[2:5], rtol=1e-5)  # about x for |x| << cap
    assert softcap(x, None) is x


def test_final_logits_never_pass_the_cap():
    spec = GEMMA2.replaced(final_logit_softcap=0.5)
    uncapped = model(spec.replaced(final_logit_softcap=None)).prefill(TOKENS)
    assert np.abs(uncapped).max() > 1.0  # so the cap below really cuts
    logits = model(spec).prefill(TOKENS)
    assert np.abs(logits).max() < 0.5
    np.testing.assert_allclose(logits, 0.5 * np.tanh(uncapped / 0.5), rtol=1e-12)


def test_attention_softcap_is_applied_to_the_scaled_scores():
    # With a huge cap the scores are untouched; a small one changes the attention weights.
    spec = GEMMA2.replaced(final_logit_softcap=None)
    free = model(spec.replaced(attn_logit_softcap=None)).prefill(TOKENS)
    np.testing.assert_allclose(model(spec.replaced(attn_logit_softcap=1e9))
                               .prefill(TOKENS), free, rtol=1e-9)
    assert not np.allclose(model(spec.replaced(attn_logit_softcap=0.1))
                           .prefill(TOKENS), free, rtol=1e-3)


def test_query_pre_attn_scalar_replaces_head_dim_in_the_score_scale():
    spec = GEMMA2.replaced(query_pre_attn_scalar=None)
    weights = family_weights(spec)
    same = spec.replaced(query_pre_attn_scalar=float(spec.attention.head_dim))
    np.testing.assert_array_equal(ReferenceModel(same, weights).prefill(TOKENS),
                                  ReferenceModel(spec, weights).prefill(TOKENS))
    other = spec.replaced(query_pre_attn_scalar=4.0 * spec.attention.head_dim)
    assert not np.allclose(ReferenceModel(other, weights).prefill(TOKENS),
                           ReferenceModel(spec, weights).prefill(TOKENS), rtol=1e-3)


def test_gelu_tanh_is_close_to_the_exact_gelu():
    x = np.linspace(-6, 6, 121)
    exact = np.array([0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x])
    np.testing.assert_allclose(gelu_tanh(x), exact, atol=1e-3)
    assert gelu_tanh(np.array([0.0]))[0] == 0.0
    # ... but it is the tanh form: at 1, 0.5 * (1 + tanh(sqrt(2 / pi) * 1.044715)).
    assert gelu_tanh(np.array([1.0]))[0] == pytest.approx(
        0.5 * (1 + math.tanh(math.sqrt(2 / math.pi) * 1.044715)), rel=1e-14)


def test_gemma_embeddings_are_scaled_by_the_root_of_the_hidden_size():
    spec = GEMMA2.replaced(tie_embeddings=False)  # the head must stay put
    weights = family_weights(spec)
    weights["lm_head.weight"] = family_weights(spec, seed=5)["model.embed_tokens.weight"]
    unscaled = spec.replaced(scale_embeddings=False)
    stretched = {**weights, "model.embed_tokens.weight":
                 weights["model.embed_tokens.weight"] * math.sqrt(spec.hidden_size)}
    np.testing.assert_allclose(ReferenceModel(spec, weights).prefill(TOKENS),
                               ReferenceModel(unscaled, stretched).prefill(TOKENS), rtol=1e-10)


@pytest.mark.parametrize("spec, act", [(GQA, lambda v: v / (1 + np.exp(-v))),
                                       (GEMMA2, gelu_tanh)], ids=["silu", "gelu_tanh"])
def test_mlp_gates_with_the_specs_activation(spec, act):
    weights = family_weights(spec)
    x = np.random.default_rng(7).standard_normal((3, spec.hidden_size))
    p = "model.layers.1.mlp."
    gate, up = x @ weights[p + "gate_proj.weight"].T, x @ weights[p + "up_proj.weight"].T
    np.testing.assert_allclose(ReferenceModel(spec, weights)._mlp(1, x),
                               (act(gate) * up) @ weights[p + "down_proj.weight"].T, rtol=1e-12)


@pytest.mark.parametrize("module", ["self_attn.o_proj", "mlp.down_proj"])
def test_sandwich_norms_normalize_each_branch_output_before_the_residual_add(module):
    # The norm after the branch undoes any scale of the branch's last projection; without
    # sandwich norms (Llama's layout) the same scale changes the logits.
    for spec, invariant in ((GEMMA2, True), (GQA, False)):
        weights = family_weights(spec)
        spec = spec.replaced(rms_norm_eps=1e-300)  # only the norm's scale matters
        scaled = dict(weights)
        for layer in range(spec.num_layers):
            scaled[f"model.layers.{layer}.{module}.weight"] = 7.0 * weights[
                f"model.layers.{layer}.{module}.weight"]
        a = ReferenceModel(spec, weights).prefill(TOKENS)
        b = ReferenceModel(spec, scaled).prefill(TOKENS)
        assert np.allclose(a, b, rtol=1e-6, atol=1e-8) == invariant, spec.name


@pytest.mark.parametrize("spec", [QWEN3, GEMMA3], ids=lambda s: s.name)
def test_qk_norm_makes_attention_blind_to_the_scale_of_queries_and_keys(spec):
    spec = spec.replaced(rms_norm_eps=1e-300)  # so only the norm's scale matters
    weights = family_weights(spec)
    scaled = dict(weights)
    for layer in range(spec.num_layers):
        for proj, factor in (("q_proj", 5.0), ("k_proj", 3.0)):
            name = f"model.layers.{layer}.self_attn.{proj}.weight"
            scaled[name] = factor * weights[name]
    np.testing.assert_allclose(ReferenceModel(spec, scaled).prefill(TOKENS),
                               ReferenceModel(spec, weights).prefill(TOKENS), rtol=1e-10)
    plain = spec.replaced(qk_norm=False)
    assert not np.allclose(ReferenceModel(plain, scaled).prefill(TOKENS),
                           ReferenceModel(plain, weights).prefill(TOKENS), rtol=1e-3)


def test_fused_phi3_tensors_split_rows_q_k_v_and_gate_up():
    # A Phi-3 model is a Llama model whose projections are stacked by rows: same logits.
    llama = GQA.replaced(rope_scaling=None)
    phi3 = llama.replaced(family="phi3")
    weights = random_weights(llama, seed=4, dtype=np.float64)
    fused = dict(weights)
    for layer in range(llama.num_layers):
        attn, mlp = f"model.layers.{layer}.self_attn.", f"model.layers.{layer}.mlp."
        fused[attn + "qkv_proj.weight"] = np.concatenate(
            [fused.pop(attn + f"{p}.weight") for p in ("q_proj", "k_proj", "v_proj")])
        fused[mlp + "gate_up_proj.weight"] = np.concatenate(
            [fused.pop(mlp + f"{p}.weight") for p in ("gate_proj", "up_proj")])
    np.testing.assert_array_equal(ReferenceModel(phi3, fused).prefill(TOKENS),
                                  ReferenceModel(llama, weights).prefill(TOKENS))


def test_longrope_switches_from_short_to_long_factors_past_the_original_context():
    plain = rope_frequencies(PHI3.replaced(rope_scaling=None))
    original = PHI3.rope.original_max_positions
    for seq_len, factors in ((None, PHI3.rope.short_factor), (1, PHI3.rope.short_factor),
                             (original, PHI3.rope.short_factor),
                             (original + 1, PHI3.rope.long_factor)):
        np.testing.assert_allclose(rope_frequencies(PHI3, seq_len=seq_len),
                                   plain / np.array(factors), rtol=1e-15)


def test_longrope_attention_factor_is_derived_from_the_stretch_unless_given():
    # max 64 over original 16: sqrt(1 + ln 4 / ln 16) = sqrt(1.5).
    assert rope_attention_factor(PHI3) == pytest.approx(math.sqrt(1.5), rel=1e-15)
    assert rope_attention_factor(PHI3.replaced(rope_attention_factor=1.25)) == 1.25
    assert rope_attention_factor(PHI3.replaced(max_position_embeddings=16)) == 1.0
    assert rope_attention_factor(GQA) == 1.0
    x = np.random.default_rng(6).standard_normal((2, 1, 6))
    turned = apply_rope(x, np.array([0, 3]), rope_frequencies(PHI3), scale=math.sqrt(1.5))
    np.testing.assert_allclose(np.linalg.norm(turned, axis=-1),
                               math.sqrt(1.5) * np.linalg.norm(x, axis=-1), rtol=1e-12)


def test_longrope_model_uses_long_factors_once_a_call_passes_the_original_context():
    spec = PHI3.replaced(rope_original_max_positions=6)
    reference = model(spec)
    full = reference.prefill(TOKENS)  # one call of 10 > 6: long factors throughout
    long_only = spec.replaced(rope_short_factor=spec.rope.long_factor)
    np.testing.assert_allclose(full, model(long_only).prefill(TOKENS), rtol=1e-12)
    steps = [*reference.prefill(TOKENS[:4])] + [reference.decode(t) for t in TOKENS[4:]]
    short = model(spec.replaced(rope_long_factor=spec.rope.short_factor))
    # Up to the original context the short factors; the call reaching position 6 switches to
    # the long ones for its new token while the cached keys keep theirs, as Hugging Face's cache.
    np.testing.assert_allclose(steps[:6], short.prefill(TOKENS)[:6], rtol=1e-12)
    assert not np.allclose(steps[6], short.prefill(TOKENS)[6], rtol=1e-3)
    assert not np.allclose(steps[6:], full[6:], rtol=1e-3)


def test_gemma3_sliding_layers_use_the_local_unscaled_rope_base():
    sliding, full = 0, 1
    assert GEMMA3.attention.window(sliding) == 3 and GEMMA3.attention.window(full) is None
    dim = GEMMA3.attention.head_dim
    base = np.arange(0, dim, 2) / dim
    np.testing.assert_allclose(rope_frequencies(GEMMA3, sliding), 1e4 ** -base, rtol=1e-15)
    np.testing.assert_allclose(rope_frequencies(GEMMA3, full), 1e6 ** -base / 4.0, rtol=1e-15)
    np.testing.assert_allclose(rope_frequencies(GEMMA3), 1e6 ** -base / 4.0, rtol=1e-15)


@pytest.mark.parametrize("kind, sees_first_token", [("sliding_attention", False),
                                                   ("full_attention", True)])
def test_layer_types_pick_sliding_or_full_attention_per_layer(kind, sees_first_token):
    # One layer; position 4 sees tokens 2..4 through a window of 3, or all of them.
    spec = GEMMA3.replaced(num_layers=1, layer_types=(kind,))
    reference = model(spec)
    before = reference.prefill(TOKENS)
    after = reference.prefill([TOKENS[0] + 1] + TOKENS[1:])
    assert not np.allclose(after[2], before[2])
    assert np.allclose(after[4], before[4], rtol=1e-12, atol=1e-12) != sees_first_token
