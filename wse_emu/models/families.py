"""Architecture families: one row each, holding everything that differs between them.

A ModelSpec describes a model in parts (``wse_emu.models.spec``); what a family adds beyond its
numbers lives in its row here: how a Hugging Face ``config.json`` of the architecture maps onto
the flat fields (which keys, transformers' defaults, the values that are modelled), where its
sliding windows fall, how its checkpoints name and pack their tensors (fused matrices, experts
one module each or all in one tensor) and how its router weighs experts. The readers
(``hf_config``, ``weights``, ``layer``, the route kernel) take the row instead of asking the
family's name, so a new dense family that reuses these quirks is one row in ``FAMILY_ROWS``.

This module imports nothing of wse-emu: the model module validates ``family`` against it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, eq=False)
class Family:
    """One architecture family."""

    name: str
    # --- its Hugging Face config.json ----------------------------------------------------
    architecture: str  # the ``architectures`` entry naming it
    model_type: str
    # Flat fields (``ModelFields``) the architecture fixes (the writer checks a spec
    # against them too).
    fixed: dict[str, Any]
    # transformers' defaults for the keys a config.json may leave out (``COMMON_DEFAULTS``
    # hold those every family shares).
    defaults: dict[str, Any]
    # Keys the architecture's code reads whose other values are not modelled:
    # key -> (the modelled values, what another value would mean).
    modelled: dict[str, tuple[tuple[Any, ...], str]]
    # The config key naming the MLP activation, and the one value of it that is modelled.
    activation: tuple[str, str]
    # The modelled rope scaling types besides "default".
    rope_types: tuple[str, ...]
    # How the family places sliding windows on its layers, reading a config and writing one:
    # names of ``hf_config``'s rules (``WINDOW_READERS``, ``WINDOW_WRITERS``).
    read_windows: str
    write_windows: str
    # Older names of rope types that transformers maps onto modelled ones.
    rope_aliases: dict[str, str] = dataclasses.field(default_factory=dict)
    # Gemma: query_pre_attn_scalar and the soft-caps are read from the config.
    attention_scalars: bool = False
    # Gemma-3: sliding layers turn with their own rope base (rope_local_base_freq), unscaled.
    local_rope: bool = False
    # A mixture of experts: the config keys of the number of experts, the experts per token
    # and an expert's MLP width; and the key saying whether the top-k weights are renormalized
    # (None: they always are).
    expert_keys: tuple[str, str, str] | None = None
    topk_norm: str | None = None
    # A key the family's published configs also state the top-k under, unread by transformers
    # (gpt-oss): where stated, it must agree.
    stated_top_k: str | None = None
    # gpt-oss: its attention bias covers o_proj too; its SwiGLU clamp (swiglu_limit) is read;
    # its experts may be MXFP4 (quantization_config), these modules left in the dtype.
    biased_o_proj: bool = False
    clamped_swiglu: bool = False
    mxfp4_experts: tuple[str, ...] | None = None
    # --- its checkpoints --------------------------------------------------------------------
    # Modules under ``model.layers.{i}.`` stored as one matrix, by the layer description's
    # modules they hold (their output rows in that order).
    fused: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    # Where the router and experts are (router, gate, up, down; {e}: the expert), and whether
    # all experts of a projection are one tensor, gate and up interleaved in one, stored
    # (in, out) with ``_bias`` tensors beside them.
    expert_tensors: tuple[str, str, str, str] | None = None
    experts_stored_together: bool = False
    # --- its numerics -------------------------------------------------------------------------
    # The router's softmax taken over the k chosen logits (gpt-oss) rather than over every
    # expert before choosing (Mixtral, Qwen3-MoE).
    softmax_after_topk: bool = False

    @property
    def is_moe(self) -> bool:
        return self.expert_tensors is not None


# Defaults every family's config shares.
COMMON_DEFAULTS = dict(torch_dtype=None, dtype=None, _name_or_path=None)

# The flat fields of a family without Gemma's or Qwen3's variants.
_PLAIN = dict(hidden_act="silu", qk_norm=False, sandwich_norms=False, norm_weight_offset=0.0,
              scale_embeddings=False, attn_logit_softcap=None, final_logit_softcap=None,
              query_pre_attn_scalar=None, rope_local_theta=None)
_GEMMA = dict(hidden_act="gelu_tanh", qk_norm=False, sandwich_norms=True,
              norm_weight_offset=1.0, scale_embeddings=True, attention_bias=False,
              rope_local_theta=None)

# Keys of other architectures that would change the numerics (null means unset). Dropout keys
# (attention_dropout, resid_pdrop, embd_pdrop) are inference-neutral, and pretraining_tp > 1
# only splits Llama's matrix products into slices (the same sums, rounded in another order),
# so neither is listed.
ANYWHERE = {
    "partial_rotary_factor": ((1.0,), "rotary embedding on part of each head"),
    "mlp_bias": ((False,), "biases in the MLP"),
    "use_qk_norm": ((False,), "norms over each query and key head"),
    "use_mrope": ((False,), "multimodal rotary positions"),
    "use_bidirectional_attention": ((False,), "attention that is not causal"),
    "quantization_config": ((None,), "quantized weights"),
}
NO_SOFTCAPS = {
    "attn_logit_softcapping": ((None,), "soft-capped attention scores"),
    "final_logit_softcapping": ((None,), "soft-capped logits"),
}
NO_BIAS = {"attention_bias": ((False,), "biases on the q, k, v and o projections; only "
                                         "Qwen2's q, k, v biases are modelled")}
QK_NORMED = {k: v for k, v in ANYWHERE.items() if k != "use_qk_norm"}
ROPE_TYPES = ("linear", "llama3")
SILU = ("hidden_act", "silu")
GELU_TANH = ("hidden_activation", "gelu_pytorch_tanh")

FAMILY_ROWS = (
    Family(
        "llama", "LlamaForCausalLM", "llama", {**_PLAIN, "attention_bias": False},
        dict(num_key_value_heads=None, head_dim=None, tie_word_embeddings=False,
             rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=2048,
             hidden_act="silu", use_sliding_window=False, sliding_window=None),
        {**ANYWHERE, **NO_SOFTCAPS, **NO_BIAS}, SILU, ROPE_TYPES,
        "flagged_every_layer", "flagged"),
    Family(
        "mistral", "MistralForCausalLM", "mistral", {**_PLAIN, "attention_bias": False},
        dict(num_key_value_heads=8, head_dim=None, tie_word_embeddings=False,
             rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=4096 * 32,
             hidden_act="silu", sliding_window=4096),
        {**ANYWHERE, **NO_SOFTCAPS, **NO_BIAS}, SILU, ROPE_TYPES,
        "every_layer", "flagged"),
    Family(
        # transformers' Qwen2 always has q, k, v biases; wse-emu's own configs may say false.
        "qwen2", "Qwen2ForCausalLM", "qwen2", dict(_PLAIN),
        dict(num_key_value_heads=32, head_dim=None, tie_word_embeddings=False,
             rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=32768,
             hidden_act="silu", use_sliding_window=False, sliding_window=4096,
             max_window_layers=28, attention_bias=True),
        {**ANYWHERE, **NO_SOFTCAPS}, SILU, ROPE_TYPES,
        "from_max_window_layers", "max_window_layers"),
    Family(
        "qwen3", "Qwen3ForCausalLM", "qwen3", {**_PLAIN, "qk_norm": True, "attention_bias": False},
        dict(num_key_value_heads=32, head_dim=128, tie_word_embeddings=False,
             rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=32768,
             hidden_act="silu", use_sliding_window=False, sliding_window=4096,
             max_window_layers=28),
        {**QK_NORMED, **NO_SOFTCAPS, **NO_BIAS}, SILU, ROPE_TYPES,
        "from_max_window_layers", "max_window_layers"),
    Family(
        "gemma2", "Gemma2ForCausalLM", "gemma2", dict(_GEMMA),
        dict(num_key_value_heads=4, head_dim=256, tie_word_embeddings=True, rms_norm_eps=1e-6,
             rope_theta=10000.0, max_position_embeddings=8192,
             hidden_activation="gelu_pytorch_tanh", sliding_window=4096,
             query_pre_attn_scalar=256, attn_logit_softcapping=50.0,
             final_logit_softcapping=30.0),
        {**ANYWHERE, **NO_BIAS}, GELU_TANH, ROPE_TYPES,
        "alternating", "layer_types", attention_scalars=True),
    Family(
        "gemma3", "Gemma3ForCausalLM", "gemma3_text",
        {k: v for k, v in _GEMMA.items() if k != "rope_local_theta"} | {"qk_norm": True},
        dict(num_key_value_heads=4, head_dim=256, tie_word_embeddings=True, rms_norm_eps=1e-6,
             rope_theta=1_000_000.0, rope_local_base_freq=10000.0,
             max_position_embeddings=131072, hidden_activation="gelu_pytorch_tanh",
             sliding_window=4096, sliding_window_pattern=6, query_pre_attn_scalar=256,
             attn_logit_softcapping=None, final_logit_softcapping=None),
        {**QK_NORMED, **NO_BIAS}, GELU_TANH, ROPE_TYPES,
        "every_nth_full", "layer_types_and_pattern", attention_scalars=True, local_rope=True),
    Family(
        "phi3", "Phi3ForCausalLM", "phi3", {**_PLAIN, "attention_bias": False},
        dict(num_key_value_heads=None, head_dim=None, tie_word_embeddings=False,
             rms_norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=4096,
             original_max_position_embeddings=4096, hidden_act="silu", sliding_window=None),
        {**ANYWHERE, **NO_SOFTCAPS, **NO_BIAS}, SILU, ("longrope",),
        "every_layer", "window",
        # Phi-3 configs written before transformers named longrope call it su (or yarn).
        rope_aliases={"su": "longrope", "yarn": "longrope"},
        # q, k and v are one matrix, gate and up another.
        fused={"self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj",
                                      "self_attn.v_proj"),
               "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj")}),
    Family(
        # Every layer's MLP is routed experts of width intermediate_size; the router's softmax
        # is taken over all experts and the top-k weights renormalized. router_jitter_noise
        # acts in training only.
        "mixtral", "MixtralForCausalLM", "mixtral", {**_PLAIN, "attention_bias": False},
        dict(num_key_value_heads=8, head_dim=None, tie_word_embeddings=False, rms_norm_eps=1e-5,
             rope_theta=1e6, max_position_embeddings=4096 * 32, hidden_act="silu",
             sliding_window=None, num_local_experts=8, num_experts_per_tok=2),
        {**ANYWHERE, **NO_SOFTCAPS, **NO_BIAS}, SILU, ROPE_TYPES,
        "every_layer", "window",
        expert_keys=("num_local_experts", "num_experts_per_tok", "intermediate_size"),
        expert_tensors=("block_sparse_moe.gate", "block_sparse_moe.experts.{e}.w1",
                        "block_sparse_moe.experts.{e}.w3", "block_sparse_moe.experts.{e}.w2")),
    Family(
        # Qwen3's attention with routed experts of width moe_intermediate_size in every layer
        # (transformers 4.51's defaults).
        "qwen3_moe", "Qwen3MoeForCausalLM", "qwen3_moe",
        {**_PLAIN, "qk_norm": True, "attention_bias": False},
        dict(num_key_value_heads=4, head_dim=None, tie_word_embeddings=False, rms_norm_eps=1e-6,
             rope_theta=10000.0, max_position_embeddings=32768, hidden_act="silu",
             use_sliding_window=False, sliding_window=4096, max_window_layers=28,
             num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768,
             norm_topk_prob=False),
        {**QK_NORMED, **NO_SOFTCAPS, **NO_BIAS,
         "decoder_sparse_step": ((1,), "dense MLP layers between the routed ones"),
         "mlp_only_layers": (([],), "layers with a dense MLP"),
         # transformers 4.51 slides the layers from max_window_layers on, 5.x every layer.
         "use_sliding_window": ((False,), "sliding windows, whose layers transformers "
                                          "versions disagree on")},
        SILU, ROPE_TYPES, "from_max_window_layers", "max_window_layers",
        expert_keys=("num_experts", "num_experts_per_tok", "moe_intermediate_size"),
        topk_norm="norm_topk_prob",
        expert_tensors=("mlp.gate", "mlp.experts.{e}.gate_proj", "mlp.experts.{e}.up_proj",
                        "mlp.experts.{e}.down_proj")),
    Family(
        # Biased attention (q, k, v and o), a sink per head, a biased router and experts with
        # a clamped SwiGLU, sliding and full layers alternating, YaRN rope scaling.
        # transformers 5's defaults (those of gpt-oss-120b).
        "gpt_oss", "GptOssForCausalLM", "gpt_oss",
        {**_PLAIN, "attention_sinks": True, "router_bias": True, "expert_bias": True},
        dict(num_key_value_heads=8, head_dim=64, tie_word_embeddings=False, rms_norm_eps=1e-5,
             rope_theta=150000.0, max_position_embeddings=131072, hidden_act="silu",
             sliding_window=128, attention_bias=True, swiglu_limit=7.0,
             num_local_experts=128, num_experts_per_tok=4, intermediate_size=2880,
             rope_scaling={"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0,
                           "beta_slow": 1.0, "truncate": False,
                           "original_max_position_embeddings": 4096}),
        # quantization_config: read as the experts' format (mxfp4_experts).
        {**{k: v for k, v in ANYWHERE.items() if k != "quantization_config"}, **NO_SOFTCAPS,
         "swiglu_alpha": ((1.702,), "a SwiGLU sigmoid slope other than gpt-oss's 1.702")},
        SILU, ("yarn",), "alternating", "layer_types",
        expert_keys=("num_local_experts", "num_experts_per_tok", "intermediate_size"),
        stated_top_k="experts_per_token", biased_o_proj=True, clamped_swiglu=True,
        # What gpt-oss's checkpoints leave unquantized: everything but the experts.
        mxfp4_experts=("model.layers.*.self_attn", "model.layers.*.mlp.router",
                       "model.embed_tokens", "lm_head"),
        expert_tensors=("mlp.router", "mlp.experts.gate_up_proj", "mlp.experts.gate_up_proj",
                        "mlp.experts.down_proj"),
        experts_stored_together=True, softmax_after_topk=True),
)

# Family name -> its row. ``register`` adds one (a test's new family, say).
FAMILIES: dict[str, Family] = {row.name: row for row in FAMILY_ROWS}


def register(row: Family) -> Family:
    """Add (or replace) a family's row."""
    FAMILIES[row.name] = row
    return row


def family_of(name: str) -> Family:
    """The row of family ``name`` (a validated ModelSpec's family always has one)."""
    try:
        return FAMILIES[name]
    except KeyError:
        raise KeyError(f"no family {name!r}; families: {', '.join(FAMILIES)}") from None
