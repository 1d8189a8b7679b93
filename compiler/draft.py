"""A draft model beside its target, for speculative decoding.

The draft proposes the tokens the target's verify step checks, so it must be close to the
target: it is compiled onto the same wafer, on a strip of full-height columns at the wafer's
far side, and the target is laid out on the columns left (its region narrowed, so its KV
cache holds fewer tokens: what the draft costs, and what the compiler reports). The strip is
the narrowest in which the draft maps with room for as many tokens of its own KV as the
target's region holds (every sequence the target decodes has its context in both); the
draft's tokens per KV entry are usually far fewer, so its weights set the width.

The draft is a model preset, a model YAML or a Hugging Face config.json of the same
vocabulary, or ``mtp``: a one-layer head of the target's own architecture (one decoder layer,
its embedding and LM head), as multi-token-prediction and EAGLE-style heads are. Such heads
share the target's embedding and LM head in the published designs; here they keep their own
copy beside the layer, which their step reads as the target's would, so their weights are
counted once more than a shared head's would be.

A target whose replica spans wafers, or a disaggregated plan, takes no draft yet: refused by
name.
"""

from __future__ import annotations

import dataclasses

from wse_emu.compiler.partition import wafers_needed
from wse_emu.errors import CompileError, UserError
from wse_emu.hardware.fabric import ClusterSpec, with_overrides
from wse_emu.models.load import load_model
from wse_emu.models.spec import ModelSpec
from wse_emu.program.format import WaferProgram
from wse_emu.program.options import CompileOptions

MTP = "mtp"  # a one-layer draft head of the target's architecture


def draft_model(target: ModelSpec, draft: str) -> ModelSpec:
    """The draft ``draft`` names for ``target``: ``mtp``, or a model of its vocabulary."""
    if draft == MTP:
        fields = {"name": f"{target.name}-mtp", "num_layers": 1}
        if target.flat().layer_types:
            fields["layer_types"] = ("full_attention",)
        return target.replaced(**fields).validate(f"the {MTP} draft of {target.name}")
    model = load_model(draft)
    if model.vocab_size != target.vocab_size:
        raise UserError(f"the draft {model.name} has a vocabulary of {model.vocab_size:,} "
                        f"tokens, {target.name} one of {target.vocab_size:,}: a draft "
                        "proposes the target's tokens, so the two must share one")
    return model


def check_draft(model: ModelSpec, cluster: ClusterSpec, options: CompileOptions) -> None:
    """What a draft does not go with, refused by name before anything is compiled."""
    if options.plan != "colocated":
        raise UserError("a draft is compiled beside a colocated target; a disaggregated plan "
                        "with a draft is not modelled yet")
    if options.region is not None:
        raise UserError("with a draft, the draft's strip sets the target's region: drop "
                        "`region`")
    if wafers_needed(model, cluster.fabric) > 1:
        raise UserError(f"{model.name} spans wafers of {cluster.fabric.name}; a draft beside "
                        "a replica that spans wafers is not modelled yet")


def compile_with_draft(model: ModelSpec, cluster: ClusterSpec, options: CompileOptions,
                       compile_fn) -> WaferProgram:
    """``model`` on each wafer's columns but a strip at the far side, and the draft options
    name on that strip, the narrowest that holds the draft with KV room for as many tokens as
    the target's region: the target's program, with the draft's in ``draft`` and what it
    takes in ``summary["draft"]``. ``compile_fn`` compiles one model (``compile_model``)."""
    check_draft(model, cluster, options)
    draft = draft_model(model, options.draft)
    fabric = cluster.fabric
    bare = dataclasses.replace(options, draft=None)
    usable = fabric.usable_bytes_per_pe
    # No narrower strip holds the draft's weights alone.
    width = max(1, -(-draft.weight_bytes() // (fabric.height * usable)))
    tried: dict[int, tuple] = {}

    def attempt(w: int) -> tuple:
        if w not in tried:
            tried[w] = _pair(model, draft, cluster, bare, w, compile_fn)
        return tried[w]

    # Widen geometrically until the draft maps with room enough, then narrow by bisection;
    # past half the wafer's columns the target would be the smaller of the two.
    widest = max(fabric.width // 2, 1)
    width = min(width, widest)
    low = width - 1
    while not _enough(attempt(width)):
        if width >= widest:
            raise CompileError(_no_room(model, draft, fabric, widest, attempt(widest)))
        low = width
        width = min(widest, max(width + 1, int(width * 1.5)))
    high = width
    while high - low > 1:
        middle = (low + high) // 2
        if _enough(attempt(middle)):
            high = middle
        else:
            low = middle
    target, side = attempt(high)
    target.draft = side
    target.summary["draft"] = draft_summary(target, side, high)
    return target


def _pair(model, draft, cluster, options, width: int, compile_fn) -> tuple:
    """(target, draft) with the draft on a strip ``width`` columns wide, or (None, None) when
    either does not map."""
    fabric = cluster.fabric
    try:
        target = compile_fn(model, cluster, dataclasses.replace(
            options, region=(fabric.width - width, fabric.height)))
        strip = with_overrides(fabric, width=width)
        side = compile_fn(draft, ClusterSpec(strip, 1), dataclasses.replace(
            options, region=(width, fabric.height)))
    except CompileError:
        return None, None
    return target, side


def _no_room(model, draft, fabric, width: int, pair: tuple) -> str:
    """Why no strip up to ``width`` columns (half the wafer's) holds the draft, and how much
    SRAM it lacks."""
    strip = width * fabric.height * fabric.usable_bytes_per_pe
    target, side = pair
    need = draft.weight_bytes()
    if target is not None and side is not None:  # the weights fit; the KV room does not
        need += target.regions[0].kv_capacity_tokens * draft.kv_bytes_per_token()
    return (f"the draft {draft.name} does not fit beside {model.name} on {fabric.name}: "
            f"with KV room for the target's tokens it needs {_gb(need)} of SRAM, and half the "
            f"wafer's columns ({width}) hold {_gb(strip)}: it lacks {_gb(max(need - strip, 0))}"
            " or more (a smaller draft, or mtp)")


def _gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB"


def _enough(pair: tuple) -> bool:
    target, side = pair
    return target is not None and side.regions[0].kv_capacity_tokens >= \
        target.regions[0].kv_capacity_tokens


def draft_summary(target: WaferProgram, side: WaferProgram, width: int) -> dict:
    """What the draft takes: its model, the strip, its weights and SRAM, and the target's KV
    room it leaves."""
    fabric = target.fabric
    sram = int(side.sram_total().sum())
    return {"model": side.model.name, "strip_columns": width,
            "strip_pes": width * fabric.height, "weight_bytes": side.model.weight_bytes(),
            "sram_bytes": sram, "share_of_wafer_pes": width / fabric.width,
            "kv_capacity_tokens": side.regions[0].kv_capacity_tokens,
            "target_kv_capacity_tokens": target.regions[0].kv_capacity_tokens}
