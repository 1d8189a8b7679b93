"""ModelSpec: the shapes of a decoder-only transformer, and loading them.

A model is a preset name under ``programs/models/``, a model YAML path, or a Hugging Face
``config.json`` (file or directory) of a supported architecture: Llama, Mistral, Qwen2, Qwen3,
Gemma-2, Gemma-3 (text) and Phi-3, pre-norm RMSNorm decoders with rotary embeddings,
grouped-query attention and a gated MLP. ``wse_emu.models.hf_config`` reads such configs (both the
transformers v4 and v5 spellings) and writes them back. Mixtral, Qwen3-MoE and gpt-oss
replace the MLP with routed experts (the first two read from a config.json too): described and
costed, not yet compiled (the compiler refuses them by name).

A ModelSpec is made of parts (attention, rope, MLP or experts, norms, storage); files speak the
flat record ModelFields (``from_fields``, ``fields``, ``PARTS``). What a family adds beyond its
numbers is its row in ``wse_emu.models.families``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from wse_emu.errors import ConfigError, UserError
from wse_emu.models import layer as ly
from wse_emu.models.families import FAMILIES, Family, family_of
from wse_emu.util.configfile import (
    build_dataclass,
    check_version,
    require,
    shown,
)

HIDDEN_ACTS = ("silu", "gelu_tanh")
# Storage formats of weight matrices, in bytes per weight: "native" is the model's dtype_bytes;
# MXFP4 packs 32 four-bit values with one 8-bit power-of-two scale (136 bits per 32 weights).
WEIGHT_FORMATS = {"native": None, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0,
                  "mxfp4": 136 / 256}
LAYER_TYPES = ("full_attention", "sliding_attention")


@dataclass(frozen=True)
class ModelFields:
    """The flat record of a model that YAML files, Hugging Face configs and field names
    (``replaced``) speak: every field of every part, in the order files write them."""

    name: str
    family: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    tie_embeddings: bool = False
    attention_bias: bool = False
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_position_embeddings: int = 4096
    sliding_window: int | None = None
    dtype_bytes: int = 2
    source: str = ""
    # Hugging Face's rope_scaling: None, "linear" or "llama3" (Llama 3.1's long-context
    # frequencies), or another type, kept by name: timing does not depend on it, but the
    # functional engine computes only the two it models.
    rope_scaling: str | None = None
    rope_scaling_factor: float = 1.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_positions: int = 8192
    # Phi-3's "longrope": per-pair frequency divisors for sequences within the original context
    # (short) and beyond it (long), and the factor cos and sin are scaled by (None: derived
    # from max_position_embeddings / rope_original_max_positions as Hugging Face does).
    rope_short_factor: tuple[float, ...] = ()
    rope_long_factor: tuple[float, ...] = ()
    rope_attention_factor: float | None = None
    # "yarn" (gpt-oss): pairs turning more than beta_fast times over the original context keep
    # their frequency, those turning fewer than beta_slow times are divided by the factor, and
    # a linear ramp blends the ones between (its ends rounded outwards with truncate); cos and
    # sin are scaled by the attention factor (None: 0.1 ln(factor) + 1).
    rope_beta_fast: float = 32.0
    rope_beta_slow: float = 1.0
    rope_truncate: bool = True
    # --- architecture variants (defaults: the Llama family) ------------------------------
    hidden_act: str = "silu"  # the gated MLP's activation: "silu" or "gelu_tanh" (GeGLU)
    qk_norm: bool = False  # RMSNorm over each head's query and key features (Qwen3, Gemma-3)
    sandwich_norms: bool = False  # Gemma-2/3: norms also after attention and after the MLP
    norm_weight_offset: float = 0.0  # Gemma scales by (offset + w): 1.0
    scale_embeddings: bool = False  # Gemma multiplies embeddings by sqrt(hidden_size)
    attn_logit_softcap: float | None = None  # scores become cap * tanh(scores / cap)
    final_logit_softcap: float | None = None  # logits likewise
    query_pre_attn_scalar: float | None = None  # scores scaled by its -1/2 power (else head_dim)
    # Per layer "full_attention" or "sliding_attention" (empty: every layer uses
    # ``sliding_window``, None meaning full); sliding layers may have their own rope base.
    layer_types: tuple[str, ...] = ()
    rope_local_theta: float | None = None
    # --- mixture of experts (Mixtral, Qwen3-MoE, gpt-oss) ---------------------------------
    # Every layer's MLP is ``num_experts`` experts of width ``moe_intermediate_size``, of which a
    # router picks ``experts_per_token`` per token and weighs their outputs (0: a dense MLP).
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    # Whether the top-k experts' router weights are renormalized to sum to 1 (Mixtral and
    # gpt-oss always; Qwen3-MoE when its config says norm_topk_prob).
    norm_topk_prob: bool = True
    router_bias: bool = False  # gpt-oss: the router and the experts' projections have biases
    expert_bias: bool = False
    # gpt-oss: a learned logit per query head that joins every softmax over keys ("sinks"),
    # and the experts' SwiGLU with its inputs clamped to +-swiglu_limit.
    attention_sinks: bool = False
    swiglu_limit: float | None = None
    o_proj_bias: bool = False  # gpt-oss: o_proj has a bias too (Qwen2's attention_bias has none)
    # How weight matrices are stored (WEIGHT_FORMATS): the experts' and all others'. Norm
    # weights and biases stay in dtype_bytes. gpt-oss ships its experts in MXFP4.
    weight_format: str = "native"
    expert_weight_format: str = "native"

    def validate(self, source: str) -> "ModelFields":
        require(self.family in FAMILIES, source,
                f"field 'family' must be one of {', '.join(FAMILIES)}, got {shown(self.family)}")
        for name in ["hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim", "vocab_size", "dtype_bytes",
                     "max_position_embeddings"]:
            require(getattr(self, name) > 0, source, f"field '{name}' must be positive")
        require(self.num_heads % self.num_kv_heads == 0, source,
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                f"({self.num_kv_heads})")
        require(self.head_dim % 2 == 0, source, "field 'head_dim' must be even (rotary pairs)")
        require(self.dtype_bytes in (2, 4), source, "field 'dtype_bytes' must be 2 or 4")
        require(self.sliding_window is None or self.sliding_window > 0, source,
                "field 'sliding_window' must be positive or null")
        require(self.rope_scaling_factor > 0 and self.rope_original_max_positions > 0, source,
                "fields 'rope_scaling_factor' and 'rope_original_max_positions' must be positive")
        require(self.rope_scaling != "llama3"
                or self.rope_high_freq_factor > self.rope_low_freq_factor > 0, source,
                "llama3 rope scaling needs 0 < rope_low_freq_factor < rope_high_freq_factor")
        pairs = self.head_dim // 2
        require(self.rope_scaling != "longrope"
                or len(self.rope_short_factor) == len(self.rope_long_factor) == pairs, source,
                f"longrope scaling needs rope_short_factor and rope_long_factor of {pairs} "
                "values (head_dim / 2)")
        require(self.rope_scaling != "yarn" or self.rope_beta_fast > self.rope_beta_slow > 0,
                source, "yarn rope scaling needs 0 < rope_beta_slow < rope_beta_fast")
        require(all(f > 0 for f in self.rope_short_factor + self.rope_long_factor), source,
                "rope_short_factor and rope_long_factor must be positive")
        require(self.hidden_act in HIDDEN_ACTS, source,
                f"field 'hidden_act' must be one of {', '.join(HIDDEN_ACTS)}, "
                f"got {shown(self.hidden_act)}")
        for name in ("attn_logit_softcap", "final_logit_softcap", "query_pre_attn_scalar",
                     "rope_local_theta", "rope_attention_factor"):
            value = getattr(self, name)
            require(value is None or value > 0, source, f"field '{name}' must be positive or null")
        moe = self.num_experts > 0
        moe_family = FAMILIES[self.family].is_moe
        require(moe == moe_family, source,
                f"family {self.family} is {'' if moe_family else 'not '}a "
                "mixture of experts: field 'num_experts' must be "
                + ("positive" if moe_family else "0"))
        require(not moe or 0 < self.experts_per_token <= self.num_experts, source,
                "field 'experts_per_token' must be between 1 and num_experts")
        require(not moe or self.moe_intermediate_size > 0, source,
                "field 'moe_intermediate_size' must be positive")
        require(moe or not (self.router_bias or self.expert_bias or self.swiglu_limit), source,
                "fields 'router_bias', 'expert_bias' and 'swiglu_limit' apply to experts only")
        # A dense model has no experts part to keep these in.
        stray = next((name for name in ("experts_per_token", "moe_intermediate_size",
                                        "norm_topk_prob") if getattr(self, name)
                      != _EXPERT_FIELD_DEFAULTS[name]), None)
        require(moe or stray is None, source, f"field '{stray}' applies to experts only")
        for name in ("weight_format", "expert_weight_format"):
            require(getattr(self, name) in WEIGHT_FORMATS, source,
                    f"field '{name}' must be one of {', '.join(WEIGHT_FORMATS)}, "
                    f"got {shown(getattr(self, name))}")
        require(moe or self.expert_weight_format == "native", source,
                "field 'expert_weight_format' applies to experts only")
        require(self.swiglu_limit is None or self.swiglu_limit > 0, source,
                "field 'swiglu_limit' must be positive or null")
        require(not self.layer_types or len(self.layer_types) == self.num_layers, source,
                f"field 'layer_types' must list all {self.num_layers} layers, "
                f"got {len(self.layer_types)}")
        bad = sorted(set(self.layer_types) - set(LAYER_TYPES))
        require(not bad, source, f"field 'layer_types' has {shown(bad[0]) if bad else ''}; "
                f"allowed: {', '.join(LAYER_TYPES)}")
        require("sliding_attention" not in self.layer_types or self.sliding_window, source,
                "sliding_attention layers need a 'sliding_window'")
        return self




_EXPERT_FIELD_DEFAULTS = {"experts_per_token": 0, "moe_intermediate_size": 0,
                          "norm_topk_prob": True}


# --- the model in parts ------------------------------------------------------------------------
# ModelSpec is made of the parts a decoder layer is built from: attention, rotary embedding, the
# MLP or the experts that replace it, the norms and how weights are stored. Files and configs
# speak the flat record above (ModelFields); PARTS says where each of its fields lives.


@dataclass(frozen=True)
class AttentionSpec:
    """Grouped-query attention: its heads, biases, norms, windows, cap and sinks."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    bias: bool = False  # biases on q, k and v (Qwen2, gpt-oss)
    o_proj_bias: bool = False  # and on o_proj (gpt-oss)
    qk_norm: bool = False  # RMSNorm over each head's query and key features (Qwen3, Gemma-3)
    # The window of sliding layers (None: full attention), and per layer "full_attention" or
    # "sliding_attention" (empty: every layer uses ``sliding_window``).
    sliding_window: int | None = None
    layer_types: tuple[str, ...] = ()
    logit_softcap: float | None = None  # scores become cap * tanh(scores / cap)
    query_pre_attn_scalar: float | None = None  # scores scaled by its -1/2 power (else head_dim)
    sinks: bool = False  # a learned logit per query head joins every softmax (gpt-oss)

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def group_size(self) -> int:
        """Query heads per KV head (grouped-query attention)."""
        return self.num_heads // self.num_kv_heads

    @property
    def scale(self) -> float:
        """What query-key products are multiplied by before the softmax."""
        return (self.query_pre_attn_scalar or self.head_dim) ** -0.5

    def window(self, layer: int) -> int | None:
        """The sliding window of ``layer``'s attention, or None for full attention."""
        if self.layer_types and self.layer_types[layer] == "full_attention":
            return None
        return self.sliding_window


@dataclass(frozen=True)
class RopeSpec:
    """Rotary embedding: its base and Hugging Face's rope_scaling."""

    theta: float = 10000.0
    # None, "linear" or "llama3" (Llama 3.1's long-context frequencies), or another type, kept
    # by name: timing does not depend on it, but the functional engine computes only the
    # types it models.
    scaling: str | None = None
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_positions: int = 8192
    # Phi-3's "longrope": per-pair frequency divisors for sequences within the original context
    # (short) and beyond it (long), and the factor cos and sin are scaled by (None: derived
    # from max_position_embeddings / original_max_positions as Hugging Face does).
    short_factor: tuple[float, ...] = ()
    long_factor: tuple[float, ...] = ()
    attention_factor: float | None = None
    # "yarn" (gpt-oss): pairs turning more than beta_fast times over the original context keep
    # their frequency, those turning fewer than beta_slow times are divided by the factor, and
    # a linear ramp blends the ones between (its ends rounded outwards with truncate); cos and
    # sin are scaled by the attention factor (None: 0.1 ln(factor) + 1).
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True
    # Gemma-3's sliding layers turn with their own base, unscaled (None: one base for all).
    local_theta: float | None = None


@dataclass(frozen=True)
class MlpSpec:
    """The dense gated MLP (a mixture of experts' experts are ``ExpertsSpec``)."""

    intermediate_size: int
    activation: str = "silu"  # "silu" (SwiGLU) or "gelu_tanh" (GeGLU)


@dataclass(frozen=True)
class ExpertsSpec:
    """Routed experts in place of every layer's MLP: ``count`` experts of width
    ``intermediate_size``, of which a router picks ``top_k`` per token and weighs their
    outputs."""

    count: int
    top_k: int
    intermediate_size: int
    # Whether the top-k experts' router weights are renormalized to sum to 1 (Mixtral and
    # gpt-oss always; Qwen3-MoE when its config says norm_topk_prob).
    norm_topk_prob: bool = True
    router_bias: bool = False  # gpt-oss: the router and the experts' projections have biases
    bias: bool = False
    swiglu_limit: float | None = None  # gpt-oss: the SwiGLU's inputs clamped to +-limit


@dataclass(frozen=True)
class NormSpec:
    """The layers' RMSNorms: epsilon, where they sit and how their weights scale."""

    eps: float = 1e-5
    sandwich: bool = False  # Gemma-2/3: norms also after attention and after the MLP
    weight_offset: float = 0.0  # Gemma scales by (offset + w): 1.0


@dataclass(frozen=True)
class StorageSpec:
    """How values are held: the dtype, and the formats of weight matrices (WEIGHT_FORMATS),
    the experts' and all others'. Norm weights and biases stay in the dtype."""

    dtype_bytes: int = 2
    weight_format: str = "native"
    expert_weight_format: str = "native"

    def matrix_bytes_per_weight(self, expert: bool = False) -> int | float:
        """Bytes a weight of a matrix takes in its storage format (an expert's, or another's)."""
        stored = WEIGHT_FORMATS[self.expert_weight_format if expert else self.weight_format]
        return self.dtype_bytes if stored is None else stored

    @property
    def quantized(self) -> bool:
        """Whether any weight matrix is stored in a format other than dtype_bytes."""
        return any(WEIGHT_FORMATS[f] not in (None, float(self.dtype_bytes))
                   for f in (self.weight_format, self.expert_weight_format))


PART_TYPES = {"attention": AttentionSpec, "rope": RopeSpec, "mlp": MlpSpec,
              "experts": ExpertsSpec, "norm": NormSpec, "storage": StorageSpec}
# Flat field name -> (part, attribute); part None: the field is ModelSpec's own.
PARTS: dict[str, tuple[str | None, str]] = {
    "name": (None, "name"), "family": (None, "family"), "hidden_size": (None, "hidden_size"),
    "intermediate_size": ("mlp", "intermediate_size"), "num_layers": (None, "num_layers"),
    "num_heads": ("attention", "num_heads"), "num_kv_heads": ("attention", "num_kv_heads"),
    "head_dim": ("attention", "head_dim"), "vocab_size": (None, "vocab_size"),
    "tie_embeddings": (None, "tie_embeddings"), "attention_bias": ("attention", "bias"),
    "rms_norm_eps": ("norm", "eps"), "rope_theta": ("rope", "theta"),
    "max_position_embeddings": (None, "max_position_embeddings"),
    "sliding_window": ("attention", "sliding_window"), "dtype_bytes": ("storage", "dtype_bytes"),
    "source": (None, "source"), "rope_scaling": ("rope", "scaling"),
    "rope_scaling_factor": ("rope", "factor"), "rope_low_freq_factor": ("rope", "low_freq_factor"),
    "rope_high_freq_factor": ("rope", "high_freq_factor"),
    "rope_original_max_positions": ("rope", "original_max_positions"),
    "rope_short_factor": ("rope", "short_factor"), "rope_long_factor": ("rope", "long_factor"),
    "rope_attention_factor": ("rope", "attention_factor"),
    "rope_beta_fast": ("rope", "beta_fast"), "rope_beta_slow": ("rope", "beta_slow"),
    "rope_truncate": ("rope", "truncate"), "hidden_act": ("mlp", "activation"),
    "qk_norm": ("attention", "qk_norm"), "sandwich_norms": ("norm", "sandwich"),
    "norm_weight_offset": ("norm", "weight_offset"),
    "scale_embeddings": (None, "scale_embeddings"),
    "attn_logit_softcap": ("attention", "logit_softcap"),
    "final_logit_softcap": (None, "final_logit_softcap"),
    "query_pre_attn_scalar": ("attention", "query_pre_attn_scalar"),
    "layer_types": ("attention", "layer_types"), "rope_local_theta": ("rope", "local_theta"),
    "num_experts": ("experts", "count"), "experts_per_token": ("experts", "top_k"),
    "moe_intermediate_size": ("experts", "intermediate_size"),
    "norm_topk_prob": ("experts", "norm_topk_prob"), "router_bias": ("experts", "router_bias"),
    "expert_bias": ("experts", "bias"), "attention_sinks": ("attention", "sinks"),
    "swiglu_limit": ("experts", "swiglu_limit"), "o_proj_bias": ("attention", "o_proj_bias"),
    "weight_format": ("storage", "weight_format"),
    "expert_weight_format": ("storage", "expert_weight_format"),
}
_FIELD_DEFAULTS = {f.name: f.default for f in dataclasses.fields(ModelFields)
                   if f.default is not dataclasses.MISSING}


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer: its own sizes, and its parts (``experts`` None: a dense
    model). Build one from the flat record with ``from_fields``; ``fields`` gives it back."""

    name: str
    family: str
    hidden_size: int
    num_layers: int
    vocab_size: int
    attention: AttentionSpec
    mlp: MlpSpec
    rope: RopeSpec = RopeSpec()
    norm: NormSpec = NormSpec()
    storage: StorageSpec = StorageSpec()
    experts: ExpertsSpec | None = None
    tie_embeddings: bool = False
    max_position_embeddings: int = 4096
    scale_embeddings: bool = False  # Gemma multiplies embeddings by sqrt(hidden_size)
    final_logit_softcap: float | None = None  # logits become cap * tanh(logits / cap)
    source: str = ""

    # --- the flat record ------------------------------------------------------------------
    @classmethod
    def from_fields(cls, *args: Any, **flat: Any) -> "ModelSpec":
        """The spec of a flat record: a ``ModelFields`` (named fields replacing its own), or
        ModelFields' arguments. Not validated: ``validate`` does that."""
        if len(args) == 1 and isinstance(args[0], ModelFields):
            fields = dataclasses.replace(args[0], **flat) if flat else args[0]
        else:
            fields = ModelFields(*args, **flat)
        own: dict[str, Any] = {}
        parts: dict[str, dict[str, Any]] = {part: {} for part in PART_TYPES}
        for name, (part, attribute) in PARTS.items():
            (own if part is None else parts[part])[attribute] = getattr(fields, name)
        built = {part: kind(**parts[part]) for part, kind in PART_TYPES.items()}
        if fields.num_experts <= 0:  # a dense model: no experts part to keep them in
            stray = next((name for name, (part, _) in PARTS.items() if part == "experts"
                          and getattr(fields, name) != _FIELD_DEFAULTS[name]), None)
            if stray is not None:
                raise ConfigError(f"model {fields.name}: field '{stray}' applies to experts "
                                  "only (num_experts is 0)")
            built["experts"] = None
        return cls(**own, **built)

    def fields(self) -> ModelFields:
        """The flat record files and configs speak (a dense model's expert fields at their
        defaults)."""
        values = {}
        for name, (part, attribute) in PARTS.items():
            holder = self if part is None else getattr(self, part)
            values[name] = _FIELD_DEFAULTS[name] if holder is None else getattr(holder, attribute)
        return ModelFields(**values)

    flat = fields

    def replaced(self, **flat: Any) -> "ModelSpec":
        """This spec with flat fields changed (``--set``-style names, as files spell them)."""
        return ModelSpec.from_fields(self.fields(), **flat)

    def to_dict(self) -> dict[str, Any]:
        """The flat record as a mapping, in the order files write it."""
        return dataclasses.asdict(self.fields())

    def validate(self, source: str) -> "ModelSpec":
        self.fields().validate(source)
        return self

    @property
    def is_moe(self) -> bool:
        return self.experts is not None

    @property
    def family_record(self) -> Family:
        """The family's row (``wse_emu.models.families``): its tensor names and other quirks."""
        return family_of(self.family)

    # --- derived sizes ----------------------------------------------------------------------
    def layer_params(self) -> int:
        """Weights of one decoder layer, as the layer description lists them."""
        return sum(op.weight_params for op in ly.layer_ops(self))

    def layer_active_params(self) -> int:
        """Weights of one decoder layer that one token's step uses (its experts only)."""
        return sum(op.active_params for op in ly.layer_ops(self))

    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    def head_params(self) -> int:
        """Final norm plus the LM head (zero extra matrix when tied to the embedding)."""
        lm = 0 if self.tie_embeddings else self.vocab_size * self.hidden_size
        return self.hidden_size + lm

    def params(self) -> int:
        return self.embedding_params() + self.num_layers * self.layer_params() + self.head_params()

    def active_params(self) -> int:
        """Parameters one token's step uses: all but the experts the router did not pick (the
        embedding table included, as Mixtral and Qwen3 count; gpt-oss leaves it out). A dense
        model uses all."""
        return (self.embedding_params() + self.num_layers * self.layer_active_params()
                + self.head_params())

    def weight_bytes(self) -> int:
        """Every weight as stored: matrices in their formats, the rest in dtype_bytes."""
        ops = ly.input_ops(self) + ly.output_ops(self)
        total = sum(ly.weight_bytes(op, self) for op in ops)
        total += self.num_layers * self.layer_weight_bytes()
        return int(round(total))

    def layer_weight_bytes(self) -> float:
        """One decoder layer's weights as stored."""
        return sum(ly.weight_bytes(op, self) for op in ly.layer_ops(self))

    def embedding_weight_bytes(self) -> float:
        return self.embedding_params() * self.storage.matrix_bytes_per_weight()

    def head_weight_bytes(self) -> float:
        """The final norm and an untied LM head, as stored."""
        lm = self.head_params() - self.hidden_size
        return (self.hidden_size * self.storage.dtype_bytes
                + lm * self.storage.matrix_bytes_per_weight())

    def kv_bytes_per_token(self) -> int:
        """K and V of one token across all layers."""
        return 2 * self.num_layers * self.attention.kv_size * self.storage.dtype_bytes

    def rope_theta_of(self, layer: int) -> float:
        """The rotary base of ``layer`` (Gemma-3's sliding layers have a local one)."""
        if self.rope.local_theta is not None and self.attention.window(layer) is not None:
            return self.rope.local_theta
        return self.rope.theta

    def rope_scaled(self, layer: int) -> bool:
        """Whether ``layer`` applies the rope scaling (Gemma-3's local layers do not)."""
        return not (self.rope.local_theta is not None
                    and self.attention.window(layer) is not None)


def model_from_dict(data: dict[str, Any], source: str) -> ModelSpec:
    check_version(data, source)
    fields = build_dataclass(ModelFields, data, source, skip=("version",)).validate(source)
    return ModelSpec.from_fields(fields)


def stored_as(model: ModelSpec, weight_format: str | None = None,
              expert_weight_format: str | None = None) -> ModelSpec:
    """``model`` with its weight matrices, and separately its experts', stored in the given
    formats (``WEIGHT_FORMATS``; None keeps the model's own, as its file or checkpoint says)."""
    changes = {name: value for name, value in (("weight_format", weight_format),
                                                ("expert_weight_format", expert_weight_format))
               if value is not None}
    for name, value in changes.items():
        if value not in WEIGHT_FORMATS:
            raise ConfigError(f"`{name}` must be one of {', '.join(WEIGHT_FORMATS)}, "
                              f"got {value!r}")
    if "expert_weight_format" in changes and not model.is_moe:
        raise ConfigError(f"`expert_weight_format` applies to a mixture of experts; "
                          f"{model.name} has no experts")
    return model.replaced(**changes) if changes else model


def formats_text(model: ModelSpec) -> str:
    """'matrices in fp8, experts in mxfp4': the stored formats other than the model's dtype."""
    return ", ".join(f"{what} in {fmt}" for what, fmt in (
        ("matrices", model.storage.weight_format), ("experts", model.storage.expert_weight_format))
        if fmt != "native")


def check_positions(model: ModelSpec, positions: int, what: str) -> None:
    """Refuse, by name, ``what`` (a step, a request) that needs more token positions than
    the model was trained for: its rotary embedding is not defined there, so a time or a
    token computed beyond them would be a number for a model that does not exist."""
    if positions > model.max_position_embeddings:
        raise UserError(f"{what} needs {positions:,} positions; {model.name} has "
                        f"{model.max_position_embeddings:,} (max_position_embeddings)")


def native(model: ModelSpec) -> ModelSpec:
    """``model`` with every weight matrix in its dtype (what a format saves is measured
    against this)."""
    return model.replaced(weight_format="native", expert_weight_format="native")
