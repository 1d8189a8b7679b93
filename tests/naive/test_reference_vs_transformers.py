"""The plain-numpy reference against Hugging Face transformers itself, family by family.

The reference is only a yardstick if it computes what transformers computes. For each family a
tiny randomly initialized model is built in transformers (eager attention), the same weights go
to the reference with a ``ModelSpec`` written out by hand (not read from the config, so a bug in
the config reader cannot hide one here), and the logits of a prefill and of single-token decode
steps must agree. The reference decodes from its own KV cache; transformers recomputes the whole
sequence at every step, and also decodes from its cache, so both ways of reaching a position are
checked.

The configurations are chosen so that each feature shows: sliding windows shorter than the
sequence, grouped-query attention, soft-caps small enough that tanh bends, a head size that is not
hidden_size / heads, Gemma-3 layers of both kinds, and a Phi-3 longrope sequence that passes the
original context in a later call.

Needs torch and transformers (not installed in CI, where the module is skipped).
"""

from __future__ import annotations

import inspect
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers", minversion="5.0")

from naive.reference_forward import ReferenceModel  # noqa: E402

from wse_emu.models.spec import ModelSpec  # noqa: E402

VOCAB, HIDDEN, INTERMEDIATE, HEADS, KV_HEADS = 128, 64, 96, 4, 2
PROMPT = [5, 99, 17, 3, 64, 127, 0, 42, 8, 71]
DECODED = [12, 88, 1, 56, 33, 120, 7, 19]  # positions 10..17
TOLERANCE = 1e-4


def shapes(**extra):
    """ModelSpec fields shared by every tiny model; ``extra`` adds or overrides."""
    fields = dict(hidden_size=HIDDEN, intermediate_size=INTERMEDIATE, num_heads=HEADS,
                  num_kv_heads=KV_HEADS, head_dim=HIDDEN // HEADS, vocab_size=VOCAB,
                  num_layers=2, dtype_bytes=4, max_position_embeddings=64)
    fields.update(extra)
    return fields


def hf_shapes(spec: ModelSpec, **extra):
    """The matching transformers config arguments. Eager attention: the plain formula, the one
    backend that soft-caps Gemma-2's scores."""
    config = dict(vocab_size=spec.vocab_size, hidden_size=spec.hidden_size,
                  intermediate_size=spec.mlp.intermediate_size, num_hidden_layers=spec.num_layers,
                  num_attention_heads=spec.attention.num_heads,
                  num_key_value_heads=spec.attention.num_kv_heads,
                  head_dim=spec.attention.head_dim, rms_norm_eps=spec.norm.eps,
                  max_position_embeddings=spec.max_position_embeddings,
                  tie_word_embeddings=spec.tie_embeddings, pad_token_id=0, bos_token_id=1,
                  eos_token_id=2, attn_implementation="eager")
    if spec.is_moe:
        # Each expert's matrix products one by one: the fused kernels take no float64.
        config["experts_implementation"] = "eager"
    config.update(extra)
    return config


def llama():
    spec = ModelSpec.from_fields(name="llama", family="llama", rope_theta=10000.0,
                                 rope_scaling="llama3",
                                 rope_scaling_factor=8.0, rope_low_freq_factor=1.0,
                                 rope_high_freq_factor=4.0, rope_original_max_positions=64,
                                 **shapes(num_layers=3, max_position_embeddings=512))
    config = transformers.LlamaConfig(**hf_shapes(spec, rope_parameters={
        "rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 64}))
    return spec, transformers.LlamaForCausalLM, config


def mistral():
    spec = ModelSpec.from_fields(name="mistral", family="mistral", sliding_window=5, rope_theta=1e6,
                                 **shapes())
    config = transformers.MistralConfig(**hf_shapes(
        spec, sliding_window=5, rope_parameters={"rope_type": "default", "rope_theta": 1e6}))
    return spec, transformers.MistralForCausalLM, config


def qwen2():
    # Sliding windows from layer 1 on (max_window_layers), linear rope scaling, biases, tied head.
    spec = ModelSpec.from_fields(name="qwen2", family="qwen2", attention_bias=True,
                                 tie_embeddings=True, rms_norm_eps=1e-6, rope_theta=1e6,
                                 rope_scaling="linear", rope_scaling_factor=2.0, sliding_window=6,
                                 layer_types=("full_attention", "sliding_attention",
                                              "sliding_attention"),
                                 **shapes(num_layers=3))
    config = transformers.Qwen2Config(**hf_shapes(
        spec, use_sliding_window=True, sliding_window=6, max_window_layers=1,
        rope_parameters={"rope_type": "linear", "rope_theta": 1e6, "factor": 2.0}))
    return spec, transformers.Qwen2ForCausalLM, config


def qwen3():
    spec = ModelSpec.from_fields(name="qwen3", family="qwen3", qk_norm=True, rms_norm_eps=1e-6,
                                 rope_theta=1e6, **shapes(head_dim=24))
    config = transformers.Qwen3Config(**hf_shapes(
        spec, rope_parameters={"rope_type": "default", "rope_theta": 1e6}))
    return spec, transformers.Qwen3ForCausalLM, config


GEMMA = dict(sandwich_norms=True, norm_weight_offset=1.0, scale_embeddings=True,
             hidden_act="gelu_tanh", tie_embeddings=True, rms_norm_eps=1e-6, sliding_window=5)


def gemma2():
    # Caps small enough that tanh bends the random model's scores and logits.
    spec = ModelSpec.from_fields(name="gemma2", family="gemma2", attn_logit_softcap=1.5,
                                 final_logit_softcap=2.5, query_pre_attn_scalar=24.0,
                                 layer_types=("sliding_attention", "full_attention") * 2,
                                 **shapes(num_layers=4), **GEMMA)
    config = transformers.Gemma2Config(**hf_shapes(
        spec, hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=24,
        attn_logit_softcapping=1.5, final_logit_softcapping=2.5, sliding_window=5,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}))
    return spec, transformers.Gemma2ForCausalLM, config


def gemma3():
    # sliding_window_pattern 3: layers 0, 1 and 3 slide, layer 2 is global; global layers use
    # rope_theta with linear scaling, sliding ones the local base unscaled.
    spec = ModelSpec.from_fields(name="gemma3", family="gemma3", qk_norm=True,
                                 query_pre_attn_scalar=32.0, rope_theta=1e6, rope_scaling="linear",
                                 rope_scaling_factor=4.0, rope_local_theta=10000.0,
                                 layer_types=("sliding_attention", "sliding_attention",
                                              "full_attention", "sliding_attention"),
                                 **shapes(num_layers=4, head_dim=32), **GEMMA)
    config = transformers.Gemma3TextConfig(**hf_shapes(
        spec, hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=32,
        sliding_window=5, sliding_window_pattern=3, rope_parameters={
            "full_attention": {"rope_type": "linear", "rope_theta": 1e6, "factor": 4.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}))
    assert list(config.layer_types) == list(spec.attention.layer_types)
    return spec, transformers.Gemma3ForCausalLM, config


PHI3_PAIRS = HIDDEN // HEADS // 2
# Distinct per pair and far apart, so using the wrong set (or none) shows in the logits.
SHORT = tuple(1.0 + 0.25 * i for i in range(PHI3_PAIRS))
LONG = tuple(2.0 + 1.5 * i for i in range(PHI3_PAIRS))


def phi3(attention_factor=None):
    # The original context (16) ends inside the decode steps (positions 10..17); the attention
    # factor is derived from 64 / 16 unless given.
    spec = ModelSpec.from_fields(name="phi3", family="phi3", rope_scaling="longrope",
                                 rope_original_max_positions=16, rope_short_factor=SHORT,
                                 rope_long_factor=LONG, rope_attention_factor=attention_factor,
                                 **shapes())
    rope = {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": list(SHORT),
            "long_factor": list(LONG), "original_max_position_embeddings": 16}
    if attention_factor is not None:
        rope["attention_factor"] = attention_factor
    config = transformers.Phi3Config(**hf_shapes(spec, original_max_position_embeddings=16,
                                                 rope_parameters=rope))
    return spec, transformers.Phi3ForCausalLM, config


def phi3_given_factor():
    spec, cls, config = phi3(attention_factor=1.3)
    return spec.replaced(name="phi3-factor"), cls, config


EXPERTS, TOP_K = 4, 2


def mixtral():
    # Four experts, two per token, renormalized; a sliding window on every layer.
    spec = ModelSpec.from_fields(name="mixtral", family="mixtral", sliding_window=5, rope_theta=1e6,
                                 num_experts=EXPERTS, experts_per_token=TOP_K,
                                 moe_intermediate_size=INTERMEDIATE, **shapes())
    config = transformers.MixtralConfig(**hf_shapes(
        spec, sliding_window=5, num_local_experts=EXPERTS, num_experts_per_tok=TOP_K,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6}))
    return spec, transformers.MixtralForCausalLM, config


def qwen3_moe():
    # Qwen3's attention; the top-k probabilities left as they are (norm_topk_prob false).
    spec = ModelSpec.from_fields(name="qwen3_moe", family="qwen3_moe", qk_norm=True,
                                 rms_norm_eps=1e-6, rope_theta=1e6, num_experts=EXPERTS,
                                 experts_per_token=TOP_K, moe_intermediate_size=32,
                                 norm_topk_prob=False, **shapes(head_dim=24))
    config = transformers.Qwen3MoeConfig(**hf_shapes(
        spec, num_experts=EXPERTS, num_experts_per_tok=TOP_K, moe_intermediate_size=32,
        norm_topk_prob=False, rope_parameters={"rope_type": "default", "rope_theta": 1e6}))
    return spec, transformers.Qwen3MoeForCausalLM, config


def gpt_oss():
    # A clamp low enough to bite the random model's activations; sliding and full layers
    # alternating; YaRN stretching an original context of 16 four times, its ramp's ends
    # between pairs, so that truncating them (gpt-oss does not) would move it.
    spec = ModelSpec.from_fields(name="gpt_oss", family="gpt_oss", attention_bias=True,
                                 o_proj_bias=True, attention_sinks=True, router_bias=True,
                                 expert_bias=True, swiglu_limit=0.8, num_experts=EXPERTS,
                                 experts_per_token=TOP_K, moe_intermediate_size=INTERMEDIATE,
                                 sliding_window=5,
                                 layer_types=("sliding_attention", "full_attention"),
                                 rope_scaling="yarn", rope_scaling_factor=4.0,
                                 rope_original_max_positions=16, rope_beta_fast=4.0,
                                 rope_beta_slow=0.25, rope_truncate=False, **shapes())
    config = transformers.GptOssConfig(**hf_shapes(
        spec, num_local_experts=EXPERTS, num_experts_per_tok=TOP_K, swiglu_limit=0.8,
        sliding_window=5, layer_types=list(spec.attention.layer_types), attention_bias=True,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                         "beta_fast": 4.0, "beta_slow": 0.25, "truncate": False,
                         "original_max_position_embeddings": 16}))
    return spec, transformers.GptOssForCausalLM, config


FAMILIES = [llama, mistral, qwen2, qwen3, gemma2, gemma3, phi3, phi3_given_factor, mixtral,
            qwen3_moe, gpt_oss]


def random_state(model, spec: ModelSpec, seed: int) -> dict[str, np.ndarray]:
    """Seeded weights for every tensor of ``model``, sized so activations stay O(1) and the
    soft-caps and norms all matter (transformers' own init makes the logits tiny)."""
    rng = np.random.default_rng(seed)
    state = {}
    for name, tensor in model.state_dict().items():
        shape = tuple(tensor.shape)
        noise = rng.standard_normal(shape)
        if name.endswith(("gate_up_proj", "experts.down_proj")):
            # All experts in one tensor: (experts, out, in), or (experts, in, out) for gpt-oss.
            fan_in = shape[1] if spec.family == "gpt_oss" else shape[2]
            state[name] = noise / math.sqrt(fan_in)
        elif name.endswith(("sinks", "_bias")):
            state[name] = 0.5 * noise if name.endswith("sinks") else 0.1 * noise
        elif name.endswith("norm.weight"):
            # Around the scale one: 1 + w for Gemma, w itself for the others.
            state[name] = (1.0 - spec.norm.weight_offset) + 0.1 * noise
        elif name.endswith(".bias"):
            state[name] = 0.1 * noise
        else:
            value = noise / math.sqrt(shape[1])
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                value /= math.sqrt(2 * spec.num_layers)  # residual branches stay O(1) summed
            state[name] = value
    if spec.tie_embeddings and "lm_head.weight" in state:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    return state


def build(family, hf_dtype):
    """The transformers model (in ``hf_dtype``) and the reference, with the same weights."""
    spec, cls, config = family()
    spec = spec.validate("test")
    torch.manual_seed(0)
    model = cls(config).eval()
    state = random_state(model, spec, seed=1)
    model.load_state_dict({name: torch.tensor(value, dtype=torch.float32)
                           for name, value in state.items()})
    model = model.to(hf_dtype)
    weights = hub_layout(spec, {name: value.astype(np.float32) for name, value in state.items()})
    if spec.tie_embeddings:
        weights.pop("lm_head.weight", None)
    return spec, model, ReferenceModel(spec, weights, np.float64)


def hub_layout(spec: ModelSpec, state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """transformers 5 keeps Mixtral's and Qwen3-MoE's experts in one (experts, 2 x width, hidden)
    gate-and-up tensor and one down tensor per layer; the Hub's checkpoints, which the reference
    reads, hold one matrix per expert and projection. gpt-oss's layout is the Hub's already."""
    if spec.family not in ("mixtral", "qwen3_moe"):
        return state
    router, gate, up, down = spec.family_record.expert_tensors
    m = spec.experts.intermediate_size
    out = {}
    for name, value in state.items():
        prefix, _, rest = name.partition(".mlp.")
        if not rest:
            out[name] = value
        elif rest == "gate.weight":
            out[f"{prefix}.{router}.weight"] = value
        elif rest == "experts.gate_up_proj":
            for e in range(spec.experts.count):
                out[f"{prefix}.{gate.format(e=e)}.weight"] = value[e, :m]
                out[f"{prefix}.{up.format(e=e)}.weight"] = value[e, m:]
        elif rest == "experts.down_proj":
            for e in range(spec.experts.count):
                out[f"{prefix}.{down.format(e=e)}.weight"] = value[e]
        else:
            raise AssertionError(f"unexpected tensor {name}")
    return out


def cache_argument(model) -> str:
    """The name transformers gives the KV cache argument (renamed within 5.x)."""
    parameters = inspect.signature(model.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def hf_logits(model, ids) -> np.ndarray:
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), use_cache=False)
    return out.logits[0].double().numpy()


def hf_cached_steps(model, prompt, decoded) -> list[np.ndarray]:
    """Prefill, then one token at a time from transformers' own cache: logits per call."""
    name = cache_argument(model)
    results = []
    with torch.no_grad():
        out = model(input_ids=torch.tensor([prompt]), use_cache=True)
        results.append(out.logits[0].double().numpy())
        for token in decoded:
            cache = out.cache if name == "cache" else out.past_key_values
            out = model(input_ids=torch.tensor([[token]]), use_cache=True, **{name: cache})
            results.append(out.logits[0].double().numpy())
    return results


def relative_error(ours: np.ndarray, theirs: np.ndarray) -> float:
    """Largest difference, relative to the largest logit (logits near zero make an elementwise
    relative error meaningless)."""
    return float(np.max(np.abs(ours - theirs)) / np.max(np.abs(theirs)))


def reference_steps(reference: ReferenceModel, prompt, decoded) -> list[np.ndarray]:
    results = [reference.prefill(prompt)]
    results += [reference.decode(token)[None, :] for token in decoded]
    return results


def crosses_original_context(spec: ModelSpec) -> bool:
    return spec.rope.scaling == "longrope"


@pytest.mark.parametrize("hf_dtype", [torch.float32, torch.float64], ids=["hf32", "hf64"])
@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.__name__)
def test_reference_decode_matches_transformers(family, hf_dtype):
    spec, model, reference = build(family, hf_dtype)
    ours = reference_steps(reference, PROMPT, DECODED)
    # transformers decoding from its cache: the same computation as the reference's, step for
    # step, longrope included (a call chooses its frequencies by its own largest position).
    cached = hf_cached_steps(model, PROMPT, DECODED)
    errors = [relative_error(a, b) for a, b in zip(ours, cached)]
    assert max(errors) < TOLERANCE, errors
    # transformers recomputing the whole sequence each step: the same logits, except after
    # longrope switched to its long factors (then every key turns with the long ones).
    for step in range(len(DECODED) + 1):
        length = len(PROMPT) + step
        if crosses_original_context(spec) and length > spec.rope.original_max_positions:
            continue
        full = hf_logits(model, (PROMPT + DECODED)[:length])
        expected = full if step == 0 else full[-1:]
        assert relative_error(ours[step], expected) < TOLERANCE, (step, spec.name)
    print(f"{spec.name} (transformers in {hf_dtype}): max relative error {max(errors):.2e}")


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.__name__)
def test_reference_prefill_of_the_whole_sequence_matches_transformers(family):
    spec, model, reference = build(family, torch.float32)
    ids = PROMPT + DECODED
    assert relative_error(reference.prefill(ids), hf_logits(model, ids)) < TOLERANCE


def test_longrope_switch_changes_the_logits_after_the_original_context():
    # Guards the comparison above: were the long and short factors interchangeable here, the
    # cached and recomputed logits would agree past the original context too.
    spec, model, reference = build(phi3, torch.float64)
    ids = PROMPT + DECODED
    recomputed = hf_logits(model, ids)[-1]
    cached = hf_cached_steps(model, PROMPT, DECODED)[-1][0]
    assert relative_error(cached, recomputed) > 1e-3
    reference.prefill(PROMPT)
    for token in DECODED:
        ours = reference.decode(token)
    assert relative_error(ours, cached) < TOLERANCE
    assert relative_error(reference.prefill(ids)[-1], recomputed) < TOLERANCE


@pytest.mark.parametrize("family", [gemma2, gemma3, mistral], ids=lambda f: f.__name__)
def test_sliding_window_is_what_transformers_masks(family):
    # A window one wider or narrower than transformers' must fail the comparison, so the
    # agreement above really pins `q - k < window`.
    spec, model, _ = build(family, torch.float64)
    ids = PROMPT + DECODED
    expected = hf_logits(model, ids)
    state = {name: tensor.double().numpy() for name, tensor in model.state_dict().items()}
    for window in (spec.attention.sliding_window - 1, spec.attention.sliding_window + 1):
        other = spec.replaced(sliding_window=window)
        assert relative_error(ReferenceModel(other, state).prefill(ids), expected) > 1e-3


@pytest.mark.parametrize("family,change", [
    (qwen3_moe, {"norm_topk_prob": True}),
    (mixtral, {"experts_per_token": 1}),
    (gpt_oss, {"swiglu_limit": 100.0}),
    (gpt_oss, {"attention_sinks": False}),
    (gpt_oss, {"rope_truncate": True}),
    (gpt_oss, {"rope_scaling": None}),
], ids=["qwen3_moe-renormalized", "mixtral-top1", "gpt_oss-unclamped", "gpt_oss-no-sinks",
        "gpt_oss-truncated-yarn", "gpt_oss-no-yarn"])
def test_expert_details_are_what_transformers_computes(family, change):
    # Each routing detail changes the logits: the agreement above pins them all (the top-k
    # renormalization, the number of experts, gpt-oss's clamp, its sinks).
    spec, model, reference = build(family, torch.float64)
    ids = PROMPT + DECODED
    expected = hf_logits(model, ids)
    assert relative_error(reference.prefill(ids), expected) < TOLERANCE
    other = ReferenceModel(spec.replaced(**change), reference.w, np.float64)
    assert relative_error(other.prefill(ids), expected) > 1e-3
