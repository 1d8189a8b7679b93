"""Hugging Face ``config.json``: reading one into a ModelSpec, and writing one from it.

A config.json is read the way transformers reads it for the named architecture: the keys that
architecture's code uses, transformers' own defaults for the keys a config leaves out, and both
spellings (v4: rope_theta, rope_scaling, torch_dtype; v5: rope_parameters, dtype). A key whose
value changes the numerics in a way ModelSpec cannot state is refused by name: one table per
family lists those keys with the values that are modelled (or make no difference).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any, Callable

from wse_emu.errors import ConfigError
from wse_emu.models.families import COMMON_DEFAULTS, FAMILIES, Family
from wse_emu.models.spec import LAYER_TYPES, ModelFields, ModelSpec, model_from_dict
from wse_emu.util.configfile import shown

_ABSENT = object()
FULL, SLIDING = LAYER_TYPES
_MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# A config's activation name -> ModelSpec.hidden_act.
_ACTIVATIONS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh"}


def _number(value: Any, what: str, source: str, whole: bool = False) -> Any:
    """A finite number (an int when ``whole``); ``what`` names it in the error."""
    kind = "whole number" if whole else "number"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{source}: {what} must be a {kind}, got {shown(value)}")
    try:
        result = float(value)
    except OverflowError:
        result = math.inf
    if not math.isfinite(result) or (whole and result != int(result)):
        raise ConfigError(f"{source}: {what} must be a finite {kind}, got {shown(value)}")
    return int(result) if whole else result


def _same(value: Any, modelled: Any) -> bool:
    # True == 1 in Python; a config's true is not its 1.
    if isinstance(value, bool) or isinstance(modelled, bool):
        return value is modelled
    return value == modelled


class _Reader:
    """Typed access to one config.json mapping, with the family's defaults for absent keys;
    errors name the file and the key."""

    def __init__(self, config: dict[str, Any], source: str, defaults: dict[str, Any]):
        self.config, self.source, self.defaults = config, source, defaults

    def get(self, key: str) -> Any:
        value = self.config.get(key, self.defaults.get(key, _ABSENT))
        if value is _ABSENT:
            raise ConfigError(f"{self.source}: missing required field '{key}'")
        return value

    def wrong(self, key: str, what: str, value: Any) -> ConfigError:
        return ConfigError(f"{self.source}: field '{key}' must be {what}, got {shown(value)}")

    def refuse(self, key: str, value: Any, why: str) -> ConfigError:
        return ConfigError(f"{self.source}: {key} {shown(value)} is not modelled ({why})")

    def integer(self, key: str, nullable: bool = False) -> int | None:
        value = self.get(key)
        if value is None and nullable:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.wrong(key, "an integer or null" if nullable else "an integer", value)
        return value

    def number(self, key: str, nullable: bool = False) -> float | None:
        value = self.get(key)
        if value is None and nullable:
            return None
        return _number(value, f"field '{key}'", self.source)

    def flag(self, key: str) -> bool:
        value = self.get(key)
        if not isinstance(value, bool):
            raise self.wrong(key, "true or false", value)
        return value

    def string(self, key: str) -> str | None:
        value = self.get(key)
        if value is not None and not isinstance(value, str):
            raise self.wrong(key, "a string", value)
        return value


# --- how each family places its sliding windows ------------------------------------------------
# A reader returns (window, layer types); None for the types means one attention kind for every
# layer. A writer states a ModelSpec's windows in the family's own keys.

def _stated_layer_types(read: _Reader, layers: int) -> tuple[str, ...] | None:
    value = read.config.get("layer_types")
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
        raise read.wrong("layer_types", "a list of names", value)
    other = next((t for t in value if t not in LAYER_TYPES), None)
    if other is not None:
        raise read.refuse("layer_types entry", other, f"only {FULL} and {SLIDING} are")
    if len(value) != layers:
        raise ConfigError(f"{read.source}: field 'layer_types' must list all {layers} layers, "
                          f"got {len(value)}")
    return tuple(value)


def _every_layer(read: _Reader, layers: int):
    """Mistral, Phi-3: sliding_window, when set, applies to every layer."""
    return read.integer("sliding_window", nullable=True), None


def _flagged_every_layer(read: _Reader, layers: int):
    """Llama: transformers' Llama has no sliding window; wse-emu's own checkpoints state one for
    every layer with use_sliding_window, as Qwen2 spells it. Without that flag (the default) a
    Llama config reads as transformers reads it: no window."""
    if not read.flag("use_sliding_window"):
        return None, None
    return read.integer("sliding_window", nullable=True), None


def _from_max_window_layers(read: _Reader, layers: int):
    """Qwen2, Qwen3: with use_sliding_window, layers from max_window_layers on slide (transformers'
    rule), unless layer_types lists them; without it no layer slides."""
    window = read.integer("sliding_window", nullable=True) if read.flag("use_sliding_window") \
        else None
    types = _stated_layer_types(read, layers)
    if types is None:
        first = read.integer("max_window_layers")
        types = tuple(SLIDING if window is not None and i >= first else FULL
                      for i in range(layers))
    return window, types


def _alternating(read: _Reader, layers: int):
    """Gemma-2: even layers slide, odd ones attend to everything (unless layer_types lists them)."""
    types = _stated_layer_types(read, layers)
    if types is None:
        types = tuple(SLIDING if i % 2 == 0 else FULL for i in range(layers))
    return read.integer("sliding_window", nullable=True), types


def _every_nth_full(read: _Reader, layers: int):
    """Gemma-3: every sliding_window_pattern-th layer attends to everything, the others slide
    (unless layer_types lists them)."""
    types = _stated_layer_types(read, layers)
    if types is None:
        pattern = read.integer("sliding_window_pattern")
        if pattern <= 0:
            raise read.wrong("sliding_window_pattern", "a positive integer", pattern)
        types = tuple(SLIDING if (i + 1) % pattern else FULL for i in range(layers))
    return read.integer("sliding_window", nullable=True), types


def _all_types(spec: ModelFields) -> tuple[str, ...]:
    """Every layer's attention kind (ModelSpec leaves the list empty when all are alike)."""
    if spec.layer_types:
        return spec.layer_types
    return (SLIDING if spec.sliding_window is not None else FULL,) * spec.num_layers


def _write_window(spec: ModelFields, config: dict[str, Any]) -> None:
    config["sliding_window"] = spec.sliding_window


def _write_flagged_window(spec: ModelFields, config: dict[str, Any]) -> None:
    config["use_sliding_window"] = spec.sliding_window is not None
    config["sliding_window"] = spec.sliding_window


def _write_max_window_layers(spec: ModelFields, config: dict[str, Any]) -> None:
    _write_flagged_window(spec, config)
    if spec.sliding_window is None:
        return
    types = _all_types(spec)
    first = types.index(SLIDING) if SLIDING in types else len(types)
    if all(t == SLIDING for t in types[first:]):
        # Full layers first, then sliding ones: transformers versions without layer_types read
        # the same split from max_window_layers.
        config["max_window_layers"] = first
    if spec.layer_types:
        config["layer_types"] = list(types)


def _write_layer_types(spec: ModelFields, config: dict[str, Any]) -> None:
    _write_window(spec, config)
    config["layer_types"] = list(_all_types(spec))


def _write_layer_types_and_pattern(spec: ModelFields, config: dict[str, Any]) -> None:
    _write_layer_types(spec, config)
    types = _all_types(spec)
    if FULL in types:
        # Gemma-3 configs of transformers versions before layer_types state the pattern.
        pattern = types.index(FULL) + 1
        if types == tuple(SLIDING if (i + 1) % pattern else FULL for i in range(len(types))):
            config["sliding_window_pattern"] = pattern


# --- the families ------------------------------------------------------------------------------
# Each family's row (``wse_emu.models.families``) names its rules for sliding windows; these
# are they.
WINDOW_READERS: dict[str, Callable[[_Reader, int], tuple[int | None, tuple[str, ...] | None]]] = {
    "every_layer": _every_layer,
    "flagged_every_layer": _flagged_every_layer,
    "from_max_window_layers": _from_max_window_layers,
    "alternating": _alternating,
    "every_nth_full": _every_nth_full,
}
WINDOW_WRITERS: dict[str, Callable[[ModelFields, dict[str, Any]], None]] = {
    "window": _write_window,
    "flagged": _write_flagged_window,
    "max_window_layers": _write_max_window_layers,
    "layer_types": _write_layer_types,
    "layer_types_and_pattern": _write_layer_types_and_pattern,
}


def hf_architectures() -> dict[str, str]:
    """Hugging Face architecture name -> our family, for every family with a row."""
    return {f.architecture: name for name, f in FAMILIES.items()}


def _hf_model_types() -> dict[str, str]:
    return {f.model_type: name for name, f in FAMILIES.items()}


# Read when imported, as before: the families of the rows this module was loaded with.
HF_ARCHITECTURES = hf_architectures()


def _hf_architectures(config: dict[str, Any], source: str) -> list[str]:
    """'architectures' as a list of names: a single string counts as a one-element list."""
    archs = config.get("architectures")
    if archs is None:
        return []
    if isinstance(archs, str):
        return [archs]
    if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
        raise ConfigError(f"{source}: field 'architectures' must be a list of names, "
                          f"got {shown(archs)}")
    return archs


def _hf_family(config: dict[str, Any], archs: list[str], source: str) -> str:
    architectures, model_types = hf_architectures(), _hf_model_types()
    named = next((architectures[a] for a in archs if a in architectures), None)
    if named is None and not archs and isinstance(config.get("model_type"), str):
        named = model_types.get(config["model_type"])
    for key in _MOE_KEYS:
        if named is not None and FAMILIES[named].expert_keys is not None:
            break  # an architecture whose experts are read
        if config.get(key):
            named = f"; {', '.join(archs)}" if archs else ""
            raise ConfigError(f"{source}: {key} {shown(config[key])} is not modelled "
                              f"(mixture-of-experts{named})")
    model_type = config.get("model_type")
    if "Gemma3ForConditionalGeneration" in archs or model_type == "gemma3":
        what = ("Gemma3ForConditionalGeneration" if "Gemma3ForConditionalGeneration" in archs
                else "model_type 'gemma3'")
        raise ConfigError(f"{source}: {what} is not modelled (the vision-language Gemma-3; "
                          "only its text model is, as Gemma3ForCausalLM with model_type "
                          "gemma3_text)")
    family = next((architectures[a] for a in archs if a in architectures), None)
    if family is None and not archs and isinstance(model_type, str):
        family = model_types.get(model_type)
    if family is None:
        found = (", ".join(a if a.isprintable() else shown(a) for a in archs) if archs
                 else f"model_type {shown(model_type)}")
        raise ConfigError(f"{source}: unsupported architecture {found}; supported: "
                          f"{', '.join(architectures)}")
    # transformers builds the model that model_type names: both must name the same family.
    if isinstance(model_type, str) and model_types.get(model_type, family) != family:
        raise ConfigError(f"{source}: 'architectures' {FAMILIES[family].architecture} and "
                          f"'model_type' {shown(model_type)} disagree")
    return family


def _check_modelled(read: _Reader, family: Family) -> None:
    for key, (modelled, why) in family.modelled.items():
        value = read.config.get(key)
        if value is None or any(_same(value, m) for m in modelled):
            continue
        sample = modelled[0]
        if isinstance(sample, bool) and not isinstance(value, bool):
            raise read.wrong(key, "true or false", value)
        if isinstance(sample, float) and (isinstance(value, bool)
                                          or not isinstance(value, (int, float))):
            raise read.wrong(key, "a number", value)
        raise read.refuse(key, value, why)


def _activation(read: _Reader, family: Family) -> str:
    key, modelled = family.activation
    value = read.string(key)
    if value != modelled:
        raise read.refuse(key, value, f"{family.architecture} is modelled with {modelled}")
    if key != "hidden_act" and read.config.get("hidden_act") not in (None, value):
        # Gemma's code reads hidden_activation; a hidden_act saying otherwise leaves the config
        # meaning two things.
        raise ConfigError(f"{read.source}: 'hidden_act' {shown(read.config['hidden_act'])} and "
                          f"'{key}' {shown(value)} disagree")
    return _ACTIVATIONS[value]


def _dtype_bytes(read: _Reader) -> int:
    old, new = read.string("torch_dtype"), read.string("dtype")
    if old is not None and new is not None and old != new:
        raise ConfigError(f"{read.source}: 'torch_dtype' {shown(old)} and 'dtype' {shown(new)} "
                          "disagree")
    key, name = ("dtype", new) if new is not None else ("torch_dtype", old)
    if name is None:
        return 2  # unstated: the half-precision weights checkpoints ship
    if name not in _DTYPE_BYTES:
        raise read.refuse(key, name, f"{', '.join(_DTYPE_BYTES)} are")
    return _DTYPE_BYTES[name]


def _layers(read: _Reader, family: Family, layers: int) -> tuple[int | None, tuple[str, ...]]:
    """sliding_window and layer_types in ModelSpec's form: the list left empty when every layer
    is alike."""
    window, types = WINDOW_READERS[family.read_windows](read, layers)
    if types is None:
        stated = _stated_layer_types(read, layers)
        uniform = SLIDING if window is not None else FULL
        if stated is not None and any(t != uniform for t in stated):
            raise read.refuse("layer_types", list(stated),
                              f"{family.architecture} gives every layer the same attention")
        return window, ()
    if window is None:
        if family.local_rope and SLIDING in types:
            raise read.refuse("sliding_window", None, "Gemma-3's sliding_attention layers "
                              "without a window")
        return None, ()  # sliding layers without a window attend to everything
    if all(t == SLIDING for t in types):
        return window, ()
    return window, types


# --- rotary embedding -------------------------------------------------------------------------

# ModelSpec rope field -> the key a rope mapping states it under.
_ROPE_KEYS = {
    "rope_scaling": "rope_type",
    "rope_scaling_factor": "factor",
    "rope_low_freq_factor": "low_freq_factor",
    "rope_high_freq_factor": "high_freq_factor",
    "rope_original_max_positions": "original_max_position_embeddings",
    "rope_short_factor": "short_factor",
    "rope_long_factor": "long_factor",
    "rope_attention_factor": "attention_factor",
    "rope_beta_fast": "beta_fast",
    "rope_beta_slow": "beta_slow",
    "rope_truncate": "truncate",
}
# Per modelled type: the keys transformers requires, and the optional ones kept. Linear scaling
# keeps llama3's fields when a config states them, so wse-emu's own configs read back whole.
_ROPE_REQUIRED = {
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor",
               "original_max_position_embeddings"),
    "longrope": ("short_factor", "long_factor"),
    "yarn": ("factor",),
}
_ROPE_OPTIONAL = {
    "linear": ("low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "llama3": (),
    "longrope": ("attention_factor",),
    "yarn": ("attention_factor", "beta_fast", "beta_slow", "truncate",
             "original_max_position_embeddings"),
}


def _factors(value: Any, what: str, source: str) -> tuple[float, ...]:
    if not isinstance(value, list):
        raise ConfigError(f"{source}: {what} must be a list of numbers, got {shown(value)}")
    return tuple(_number(v, what, source) for v in value)


def _rope_entry(entry: Any, where: str, read: _Reader, family: Family,
                default_type: str | None) -> tuple[float | None, dict[str, Any]]:
    """(rope_theta if stated, ModelSpec scaling fields) of one rope mapping: rope_scaling (v4)
    or rope_parameters or one of its per-layer-type entries (v5)."""
    source = read.source
    if not isinstance(entry, dict):
        raise ConfigError(f"{source}: field '{where}' must be a mapping or null, "
                          f"got {shown(entry)}")
    theta = entry.get("rope_theta")
    if theta is not None:
        theta = _number(theta, f"{where} 'rope_theta'", source)
    partial = entry.get("partial_rotary_factor")
    if partial is not None and not _same(partial, 1.0):
        raise read.refuse(f"{where} partial_rotary_factor", partial,
                          "rotary embedding on part of each head")
    if "rope_type" in entry and "type" in entry and entry["rope_type"] != entry["type"]:
        raise ConfigError(f"{source}: {where} 'rope_type' {shown(entry['rope_type'])} and "
                          f"'type' {shown(entry['type'])} disagree")
    kind = entry.get("rope_type", entry.get("type", default_type))
    if kind is None:
        raise ConfigError(f"{source}: field '{where}' has no 'rope_type'")
    if not isinstance(kind, str):
        raise ConfigError(f"{source}: {where} 'rope_type' must be a string, got {shown(kind)}")
    kind = family.rope_aliases.get(kind, kind)
    if kind == "default":
        return theta, {}
    if kind not in family.rope_types:
        raise read.refuse(f"{where} rope_type", kind,
                          f"{family.architecture} is modelled with "
                          f"{', '.join(('default',) + family.rope_types)}")
    missing = next((k for k in _ROPE_REQUIRED[kind] if entry.get(k) is None), None)
    if missing is not None:
        raise ConfigError(f"{source}: {where} ({kind}) is missing '{missing}'")
    fields: dict[str, Any] = {"rope_scaling": kind}
    for field, key in _ROPE_KEYS.items():
        if key not in _ROPE_REQUIRED[kind] + _ROPE_OPTIONAL[kind] or entry.get(key) is None:
            continue
        what = f"{where} '{key}'"
        if key in ("short_factor", "long_factor"):
            fields[field] = _factors(entry[key], what, source)
        elif key == "truncate":
            if not isinstance(entry[key], bool):
                raise ConfigError(f"{source}: {what} must be true or false, "
                                  f"got {shown(entry[key])}")
            fields[field] = entry[key]
        else:
            fields[field] = _number(entry[key], what, source,
                                    whole=key == "original_max_position_embeddings")
    if kind == "yarn":
        for key in ("mscale", "mscale_all_dim"):
            if entry.get(key):
                raise read.refuse(f"{where} {key}", entry[key], "DeepSeek's YaRN attention scale")
        # The original context is the whole context when unstated. transformers computes with
        # `factor` and only warns when max_position_embeddings / original says otherwise:
        # such a config means two things, so it is refused.
        original = fields.get("rope_original_max_positions")
        context = read.integer("max_position_embeddings")
        if original is None:
            fields["rope_original_max_positions"] = context
        elif not math.isclose(context / original, fields["rope_scaling_factor"]):
            raise ConfigError(f"{source}: {where} factor {shown(fields['rope_scaling_factor'])} "
                              f"and max_position_embeddings / original_max_position_embeddings "
                              f"({context} / {original}) disagree (transformers warns and uses "
                              "the factor)")
    if kind == "longrope":
        # transformers' Phi-3 takes the original context from its own top-level key (4096 when
        # absent), whatever the rope mapping says, and derives the scaling factor from it.
        top = read.integer("original_max_position_embeddings")
        stated = entry.get("original_max_position_embeddings")
        if stated is not None and not _same(stated, top):
            raise ConfigError(f"{source}: 'original_max_position_embeddings' {shown(top)} and "
                              f"{where} original_max_position_embeddings {shown(stated)} "
                              "disagree")
        fields["rope_original_max_positions"] = top
    return theta, fields


def _rope_parameter_entries(params: dict[str, Any], read: _Reader,
                            family: Family) -> tuple[Any, Any, str]:
    """rope_parameters as (the entry of full-attention layers, Gemma-3's sliding-layer entry or
    None, the name of the first in messages)."""
    nested = bool(params) and all(k in LAYER_TYPES and isinstance(v, dict)
                                  for k, v in params.items())
    if family.local_rope:
        if not nested or set(params) != set(LAYER_TYPES):
            raise ConfigError(f"{read.source}: field 'rope_parameters' must map both "
                              f"{FULL} and {SLIDING} for Gemma-3, got {shown(params)}")
        return params[FULL], params[SLIDING], f"rope_parameters {FULL}"
    if nested:
        entries = list(params.values())
        if any(e != entries[0] for e in entries):
            raise read.refuse("rope_parameters", params,
                              "rotary embedding that differs between layer types")
        return entries[0], None, "rope_parameters"
    return params, None, "rope_parameters"


def _agree(source: str, old_key: str, old: Any, new_key: str, new: Any) -> Any:
    """The value both spellings state (refused when they differ), or whichever one does."""
    if old is not None and new is not None and old != new:
        raise ConfigError(f"{source}: {old_key} {shown(old)} and {new_key} {shown(new)} "
                          "disagree")
    return new if new is not None else old


def _rope(read: _Reader, family: Family) -> dict[str, Any]:
    """rope_theta, the scaling fields and (Gemma-3) rope_local_theta, from either spelling."""
    config, source = read.config, read.source
    old_theta = read.number("rope_theta") if "rope_theta" in config else None
    old_local = (read.number("rope_local_base_freq")
                 if family.local_rope and "rope_local_base_freq" in config else None)
    # v4: rope_scaling null states plain rotary embedding; absent states nothing.
    old_scaling = None
    if "rope_scaling" in config:
        old_scaling = {}
        if config["rope_scaling"] is not None:
            old_scaling = _rope_entry(config["rope_scaling"], "rope_scaling", read, family,
                                      None)[1]
    new_theta = new_local = new_scaling = None
    params = config.get("rope_parameters")
    if params is not None:
        if not isinstance(params, dict):
            raise ConfigError(f"{source}: field 'rope_parameters' must be a mapping or null, "
                              f"got {shown(params)}")
        full, sliding, where = _rope_parameter_entries(params, read, family)
        new_theta, new_scaling = _rope_entry(full, where, read, family, "default")
        if sliding is not None:
            where_local = f"rope_parameters {SLIDING}"
            new_local, local_scaling = _rope_entry(sliding, where_local, read, family, "default")
            if local_scaling:
                raise read.refuse(f"{where_local} rope_type", local_scaling["rope_scaling"],
                                  "Gemma-3's sliding layers use plain rotary embedding")
    theta = _agree(source, "'rope_theta'", old_theta, "'rope_parameters' rope_theta", new_theta)
    fields: dict[str, Any] = {"rope_theta": theta if theta is not None
                              else read.number("rope_theta")}
    if old_scaling is not None and new_scaling is not None and old_scaling != new_scaling:
        field = next(f for f in _ROPE_KEYS if old_scaling.get(f) != new_scaling.get(f))
        old_value, new_value = old_scaling.get(field), new_scaling.get(field)
        if field == "rope_scaling":
            old_value, new_value = old_value or "default", new_value or "default"
        _agree(source, f"'rope_scaling' {_ROPE_KEYS[field]}", old_value,
               f"'rope_parameters' {_ROPE_KEYS[field]}", new_value)
    fields.update(new_scaling if new_scaling is not None else old_scaling or {})
    if family.local_rope:
        local = _agree(source, "'rope_local_base_freq'", old_local,
                       f"'rope_parameters' {SLIDING} rope_theta", new_local)
        fields["rope_local_theta"] = (local if local is not None
                                      else read.number("rope_local_base_freq"))
    return fields


# --- reading ------------------------------------------------------------------------------------

def model_from_hf_config(config: dict[str, Any], source: str, name: str | None = None) -> ModelSpec:
    """Translate a Hugging Face ``config.json`` mapping (transformers v4 or v5 spelling) of a
    supported architecture; anything else, or any numerics it cannot state, raises ConfigError."""
    archs = _hf_architectures(config, source)
    family_name = _hf_family(config, archs, source)
    family = FAMILIES[family_name]
    if "rope_scaling" in family.defaults and config.get("rope_scaling") is None \
            and config.get("rope_parameters") is None:
        # A family whose config class states a default rope (transformers' GptOssConfig: its
        # YaRN) turns an unstated (or null) rope into it.
        config = {**config, "rope_scaling": dict(family.defaults["rope_scaling"])}
    read = _Reader(config, source, {**COMMON_DEFAULTS, **family.defaults})
    _check_modelled(read, family)
    hidden = read.integer("hidden_size")
    heads = read.integer("num_attention_heads")
    layers = read.integer("num_hidden_layers")
    # null or 0 means "derive it", as transformers does.
    head_dim = read.integer("head_dim", nullable=True) or (hidden // heads if heads else 0)
    kv_heads = read.integer("num_key_value_heads", nullable=True) or heads
    window, types = _layers(read, family, layers)
    data: dict[str, Any] = dict(family.fixed)
    data.update(_rope(read, family))
    if data.get("rope_scaling") == "longrope" and heads and head_dim != hidden // heads:
        raise read.refuse("head_dim", head_dim, "with longrope, transformers' Phi-3 sizes the "
                          f"rope factors by hidden_size / num_attention_heads = {hidden // heads}")
    if "attention_bias" not in family.fixed:
        data["attention_bias"] = read.flag("attention_bias")
    if family.attention_scalars:
        data.update(query_pre_attn_scalar=read.number("query_pre_attn_scalar"),
                    attn_logit_softcap=read.number("attn_logit_softcapping", nullable=True),
                    final_logit_softcap=read.number("final_logit_softcapping", nullable=True))
    data.update({
        "name": name or read.string("_name_or_path") or Path(source).parent.name or family_name,
        "family": family_name,
        "hidden_size": hidden,
        "intermediate_size": read.integer("intermediate_size"),
        "num_layers": layers,
        "num_heads": heads,
        "num_kv_heads": kv_heads,
        "head_dim": head_dim,
        "vocab_size": read.integer("vocab_size"),
        "tie_embeddings": read.flag("tie_word_embeddings"),
        "rms_norm_eps": read.number("rms_norm_eps"),
        "max_position_embeddings": read.integer("max_position_embeddings"),
        "sliding_window": window,
        "layer_types": types,
        "dtype_bytes": _dtype_bytes(read),
        "hidden_act": _activation(read, family),
        "source": f"Hugging Face config {source}",
    })
    if family.expert_keys is not None:
        count, top_k, width = family.expert_keys
        # transformers reads num_experts and num_local_experts as one attribute (in every
        # family here).
        stated = [k for k in ("num_experts", "num_local_experts") if config.get(k) is not None]
        _check_same(config, source, *stated)
        if family.stated_top_k:
            _check_same(config, source, family.stated_top_k, top_k)
        data.update(num_experts=read.integer(stated[0] if stated else count),
                    experts_per_token=read.integer(top_k),
                    moe_intermediate_size=read.integer(width),
                    norm_topk_prob=read.flag(family.topk_norm) if family.topk_norm else True)
    if family.biased_o_proj:
        data["o_proj_bias"] = data["attention_bias"]
    if family.clamped_swiglu:
        data["swiglu_limit"] = read.number("swiglu_limit")
    if family.mxfp4_experts is not None:
        data["expert_weight_format"] = _experts_format(read, family)
    return model_from_dict(data, source)


def _check_same(config: dict[str, Any], source: str, *keys: str) -> None:
    """Keys a config may state the same value under: where both are stated, they agree."""
    if len(keys) == 2 and all(config.get(k) is not None for k in keys) \
            and not _same(config[keys[0]], config[keys[1]]):
        raise ConfigError(f"{source}: '{keys[0]}' {shown(config[keys[0]])} and '{keys[1]}' "
                          f"{shown(config[keys[1]])} disagree")


def _experts_format(read: _Reader, family: Family) -> str:
    """A family's quantization_config where its experts may be MXFP4 (gpt-oss): absent
    (weights in the dtype), or MXFP4 experts."""
    config = read.config.get("quantization_config")
    if config is None:
        return "native"
    if not isinstance(config, dict):
        raise read.wrong("quantization_config", "a mapping or null", config)
    method = config.get("quant_method")
    if method != "mxfp4":
        raise read.refuse("quantization_config quant_method", method,
                          "gpt-oss's experts are modelled in mxfp4 only")
    kept = config.get("modules_to_not_convert", list(family.mxfp4_experts))
    if not isinstance(kept, list) or any("experts" in str(m) for m in kept):
        raise read.refuse("quantization_config modules_to_not_convert", kept,
                          "MXFP4 on gpt-oss's experts only")
    return "mxfp4"


# --- writing ------------------------------------------------------------------------------------

def _rope_scaling_config(spec: ModelFields) -> dict[str, Any] | None:
    if spec.rope_scaling is None:
        return None
    if spec.rope_scaling == "longrope":
        scaling: dict[str, Any] = {"rope_type": "longrope",
                                   "short_factor": list(spec.rope_short_factor),
                                   "long_factor": list(spec.rope_long_factor)}
        if spec.rope_attention_factor is not None:
            scaling["attention_factor"] = spec.rope_attention_factor
        return scaling
    if spec.rope_scaling == "yarn":
        scaling = {"rope_type": "yarn", "factor": spec.rope_scaling_factor,
                   "beta_fast": spec.rope_beta_fast, "beta_slow": spec.rope_beta_slow,
                   "truncate": spec.rope_truncate,
                   "original_max_position_embeddings": spec.rope_original_max_positions}
        if spec.rope_attention_factor is not None:
            scaling["attention_factor"] = spec.rope_attention_factor
        return scaling
    return {"rope_type": spec.rope_scaling, "factor": spec.rope_scaling_factor,
            "low_freq_factor": spec.rope_low_freq_factor,
            "high_freq_factor": spec.rope_high_freq_factor,
            "original_max_position_embeddings": spec.rope_original_max_positions}


def _check_reads_back(spec: ModelFields, config: dict[str, Any]) -> None:
    """A written config must rebuild the spec; a spec no config of its family can state (a
    Llama with Qwen2's biases, a Phi-3 with per-layer windows, ...) is refused by field."""
    family = FAMILIES[spec.family]
    label = f"model {spec.name} as a Hugging Face {family.architecture} config"
    back = model_from_hf_config(config, label, name=spec.name).fields()
    expected = spec
    if family.attention_scalars and spec.query_pre_attn_scalar is None:
        # Written as head_dim: the same scale.
        expected = dataclasses.replace(spec, query_pre_attn_scalar=float(spec.head_dim))
    for field in dataclasses.fields(ModelFields):
        if field.name in ("name", "source"):
            continue
        want, got = getattr(expected, field.name), getattr(back, field.name)
        if want != got:
            raise ConfigError(f"{label}: field '{field.name}' {shown(want)} cannot be stated "
                              f"(it would read back as {shown(got)})")


def hf_config(spec: ModelSpec) -> dict[str, Any]:
    """A Hugging Face ``config.json`` mapping in transformers v4 spelling (rope_theta,
    rope_scaling, torch_dtype) from which ``model_from_hf_config`` rebuilds ``spec`` (its name
    aside); a spec no such config can state raises ConfigError."""
    family = FAMILIES.get(spec.family)
    if family is None:
        raise ConfigError(f"model {spec.name}: a config.json of family {shown(spec.family)} is "
                          f"not written yet (families written: {', '.join(FAMILIES)})")
    spec = spec.fields()  # a config.json is a flat record, as model files are
    activation_key, activation = family.activation
    config: dict[str, Any] = {
        "architectures": [family.architecture],
        "model_type": family.model_type,
        "_name_or_path": spec.name,
        activation_key: activation,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim,
        "vocab_size": spec.vocab_size,
        "tie_word_embeddings": spec.tie_embeddings,
        "attention_bias": spec.attention_bias,
        "rms_norm_eps": spec.rms_norm_eps,
        "rope_theta": spec.rope_theta,
        "max_position_embeddings": spec.max_position_embeddings,
    }
    WINDOW_WRITERS[family.write_windows](spec, config)
    config["torch_dtype"] = "float32" if spec.dtype_bytes == 4 else "bfloat16"
    config["rope_scaling"] = _rope_scaling_config(spec)
    if spec.rope_scaling == "longrope":
        config["original_max_position_embeddings"] = spec.rope_original_max_positions
    if family.attention_scalars:
        config["query_pre_attn_scalar"] = (spec.query_pre_attn_scalar
                                           if spec.query_pre_attn_scalar is not None
                                           else float(spec.head_dim))
        config["attn_logit_softcapping"] = spec.attn_logit_softcap
        config["final_logit_softcapping"] = spec.final_logit_softcap
    if family.local_rope:
        config["rope_local_base_freq"] = (spec.rope_local_theta if spec.rope_local_theta
                                          is not None else spec.rope_theta)
    if family.expert_keys is not None:
        count, top_k, width = family.expert_keys
        config.update({count: spec.num_experts, top_k: spec.experts_per_token,
                       width: spec.moe_intermediate_size})
        if family.topk_norm:
            config[family.topk_norm] = spec.norm_topk_prob
    if family.clamped_swiglu:
        config["swiglu_limit"] = spec.swiglu_limit
    if family.mxfp4_experts is not None and spec.expert_weight_format == "mxfp4":
        config["quantization_config"] = {"quant_method": "mxfp4",
                                         "modules_to_not_convert": list(family.mxfp4_experts)}
    _check_reads_back(spec, config)
    return config


def hf_config_v5(spec: ModelSpec) -> dict[str, Any]:
    """``hf_config`` in transformers v5 spelling: rope_parameters (per layer type for Gemma-3)
    and dtype."""
    config = hf_config(spec)
    family = FAMILIES[spec.family]
    rope = config.pop("rope_scaling") or {"rope_type": "default"}
    rope["rope_theta"] = config.pop("rope_theta")
    if rope["rope_type"] == "longrope":
        # transformers v5 copies Phi-3's original context into the rope mapping when saving.
        rope["original_max_position_embeddings"] = config["original_max_position_embeddings"]
    if family.local_rope:
        rope = {FULL: rope, SLIDING: {"rope_type": "default",
                                      "rope_theta": config.pop("rope_local_base_freq")}}
    config["rope_parameters"] = rope
    config["dtype"] = config.pop("torch_dtype")
    _check_reads_back(spec.fields(), config)
    return config
