"""A draft model beside its target, for speculative decoding.

The draft proposes the tokens the target's verify step checks, so it must be close to the
target: it is compiled onto a strip of full-height columns at the far side of the wafer that
holds each replica's last stage (every wafer, for replicas of one wafer; a replica's last
wafer, for one that spans several, its other wafers whole), and the target is laid out, in any
plan, on the columns left (``CompileOptions.reserved_columns``), so its KV cache holds fewer
tokens: what the draft costs, and what the compiler reports. The strip is the narrowest in
which the draft maps with room for as many tokens of its own KV as the target's regions whose
last stage shares its wafer hold (every sequence the target serves there has its context in
both); the draft's KV per token is usually far smaller, so its weights set the width. With a
draft, the target keeps one replica per wafer (or per group of wafers it spans), so that one
draft serves one replica's micro-batches.

On a wafer that holds both a prefill and a decode region (a split by columns), the two share
the strip: the prefill region's draft fills the draft's KV from each prompt, the decode
region's drafts tokens, and each is timed as if it had the strip to itself (a simplification
in the split's favour, said where the split is reported).

The draft is a model preset, a model YAML or a Hugging Face config.json of the same
vocabulary (laid out whole on the strip: its own embedding, layers and LM head), or ``mtp``:
a one-layer head of the target's own architecture, as multi-token-prediction and EAGLE-style
heads are. As in their published designs, such a head shares the target's embedding and LM
head: its strip holds its decoder layer alone (``CompileOptions.ends_shared``), and each of its
steps runs the target's embedding and LM-head kernels once more, which the serving tables time
(``sim.shared_ends``). The projection such heads apply to their input (the token's embedding
beside the target's hidden state, 2h values to h) is not laid out: the strip holds the layer's
weights and no more.
"""

from __future__ import annotations

import dataclasses

from wse_emu.compiler.partition import laid_weight_bytes
from wse_emu.errors import CompileError, UserError
from wse_emu.hardware.fabric import ClusterSpec, with_overrides
from wse_emu.models.load import load_model
from wse_emu.models.spec import ModelSpec
from wse_emu.program.format import WaferProgram
from wse_emu.program.options import CompileOptions

MTP = "mtp"  # a one-layer draft head of the target's architecture
# Strip widths tried one by one past the first that crowds the target out (``compile_with_draft``)
CROWDED_SCAN = 16


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


def compile_with_draft(model: ModelSpec, cluster: ClusterSpec, options: CompileOptions,
                       compile_fn) -> WaferProgram:
    """``model`` on the columns a strip at the far side of each replica's last wafer leaves,
    and the draft ``options`` names on that strip: the narrowest that holds the draft with KV
    room for as many tokens as the target's regions that end on one wafer, or the width
    ``options.draft_columns`` asks for. Returns the target's program, with the draft's in
    ``draft`` and what it takes in ``summary["draft"]``. ``compile_fn`` compiles one model
    (``compile_model``)."""
    draft = draft_model(model, options.draft)
    fabric = cluster.fabric
    usable = fabric.usable_bytes_per_pe
    # No narrower strip holds the draft's weights alone.
    width = max(1, -(-_laid(draft, options) // (fabric.height * usable)))
    tried: dict[int, tuple] = {}

    def attempt(w: int) -> tuple:
        if w not in tried:
            tried[w] = _pair(model, draft, cluster, options, w, compile_fn)
        return tried[w]

    # Widen geometrically until the draft maps with room enough (or the target no longer
    # does), then narrow by bisection; past half the wafer's columns the target would be the
    # smaller of the two. A target that fills its wafers to the brim can miss beside the
    # narrowest strip and map beside one a few columns wider (its stages regroup, its blocks
    # round to whole PEs), so the next few widths are tried before its own error is given.
    widest = max(fabric.width // 2, 1)
    if options.draft_columns is not None:
        return _finish(_on_strip(model, draft, fabric, options.draft_columns, widest, attempt,
                                 options), options, fabric, options.draft_columns)
    width = min(width, widest)
    target, _ = attempt(width)
    if isinstance(target, str):
        wider = next((w for w in range(width + 1, min(width + CROWDED_SCAN, widest) + 1)
                      if not isinstance(attempt(w)[0], str)), None)
        if wider is None:
            raise CompileError(f"{model.name} does not map on the columns of {fabric.name} "
                               f"left beside the draft {draft.name}'s strip of {width}: "
                               f"{target}")
        width = wider
    low = width - 1
    while _state(attempt(width)) == SHORT:
        if width >= widest:
            raise CompileError(_no_room(model, draft, fabric, widest, attempt(widest),
                                            options))
        low, width = width, min(widest, max(width + 1, int(width * 1.5)))
    # The narrowest strip that holds both lies in (low, width], if any does: a narrower one
    # leaves the draft short of room, a wider one the target (a replica over wafers needing
    # one wafer more than the cluster's split gives it, say).
    high = width
    best = high if _state(attempt(high)) == FITS else None
    while high - low > 1:
        middle = (low + high) // 2
        state = _state(attempt(middle))
        if state == SHORT:
            low = middle
        else:
            high = middle
            best = middle if state == FITS else best
    if best is None:
        # A target that fills its wafers nearly to the brim lays out beside some strips and
        # not beside others a column wider or narrower (its blocks round to whole PEs), so the
        # next few widths are tried one by one before giving up.
        best = next((w for w in range(high + 1, min(high + CROWDED_SCAN, widest) + 1)
                     if _state(attempt(w)) == FITS), None)
    if best is None:
        raise CompileError(_crowded(model, draft, fabric, low, attempt(low), attempt(high)))
    return _finish(attempt(best), options, fabric, best)


def _on_strip(model, draft, fabric, width: int, widest: int, attempt,
              options: CompileOptions) -> tuple:
    """(target, draft) with the draft on the strip of ``width`` columns asked for
    (``CompileOptions.draft_columns``), or why not: wider than half the wafer, too narrow to
    hold the draft (and how much it lacks), or crowding the target out."""
    if width > widest:
        raise UserError(f"`draft_columns` = {width}: the draft's strip may take at most half "
                        f"of {fabric.name}'s {fabric.width} columns ({widest})")
    pair = attempt(width)
    state = _state(pair)
    if state == CROWDED:
        raise CompileError(f"{model.name} does not map on the columns of {fabric.name} left "
                           f"beside the draft {draft.name}'s strip of {width}: {pair[0]}")
    if state == SHORT:
        raise CompileError(_short(model, draft, fabric, width, pair, options))
    return pair


def _finish(pair: tuple, options: CompileOptions, fabric, width: int) -> WaferProgram:
    """The target of ``pair`` with its draft, as compiled: the draft named, its strip's width
    if one was asked for, and what it takes in ``summary["draft"]``."""
    target, side = pair
    target.draft = side
    # What it was compiled with: the draft named, and one replica per wafer part beside it.
    target.options = dataclasses.replace(target.options, draft=options.draft,
                                         draft_columns=options.draft_columns)
    target.summary["draft"] = draft_summary(target, side, fabric, width)
    return target


def _pair(model, draft, cluster, options, width: int, compile_fn) -> tuple:
    """(target, draft) with the draft on a strip ``width`` columns wide; where one does not
    map, why instead of it (a string; both, when the target does not)."""
    fabric = cluster.fabric
    if width >= fabric.width:
        return "no columns left", "no columns left"
    strip = with_overrides(fabric, width=width)
    alone = dataclasses.replace(options, draft=None, draft_columns=None,
                                max_replicas_per_part=1, reserved_columns=width)
    own = dataclasses.replace(alone, plan="colocated", prefill_share=None,
                              prefill_systems=None, region=(width, fabric.height),
                              layers_per_stage=None, reserved_columns=0,
                              ends_shared=options.draft == MTP)
    try:
        target = compile_fn(model, cluster, alone)
    except CompileError as exc:
        return str(exc), str(exc)
    try:
        side = compile_fn(draft, ClusterSpec(strip, 1), own)
    except CompileError as exc:
        return target, str(exc)
    return target, side


def tokens_per_wafer(program: WaferProgram) -> int:
    """The KV tokens the target's regions hold, summed over those whose last stage (and so
    whose draft's strip) is on one wafer: the most of any wafer."""
    held = [0] * program.systems
    for r in program.regions:
        held[r.parts[-1].system] += r.kv_capacity_tokens
    return max(held)


def strip_systems(program: WaferProgram) -> list[int]:
    """The wafers that hold a draft's strip: each replica's last."""
    return sorted({r.parts[-1].system for r in program.regions})


def _no_room(model, draft, fabric, width: int, pair: tuple, options) -> str:
    """Why no strip up to ``width`` columns (half the wafer's) holds the draft, and how much
    SRAM it lacks."""
    need, strip, what = _room(draft, fabric, width, pair, options)
    return (f"the draft {draft.name} does not fit beside {model.name} on {fabric.name}: "
            f"{what} {_gb(need)} of SRAM, and half the wafer's columns ({width}) hold "
            f"{_gb(strip)}: it lacks {_gb(max(need - strip, 0))} or more (a smaller draft, or "
            "mtp)")


def _short(model, draft, fabric, width: int, pair: tuple, options) -> str:
    """Why the strip of ``width`` columns asked for does not hold the draft, and how much
    SRAM it lacks."""
    need, strip, what = _room(draft, fabric, width, pair, options)
    where = (f"the draft {draft.name}'s strip of {width} columns (`draft_columns`) beside "
             f"{model.name} on {fabric.name}")
    wider = "a wider strip, or leave `draft_columns` out for the narrowest that holds it"
    if need <= strip:  # room enough in all, but its blocks do not map on so narrow a strip
        return f"{where} does not hold it ({' '.join(pair[1].split())}): {wider}"
    return (f"{where} holds {_gb(strip)}, and {what} {_gb(need)}: it lacks "
            f"{_gb(need - strip)} or more ({wider})")


def _room(draft, fabric, width: int, pair: tuple, options) -> tuple[int, int, str]:
    """(the SRAM the draft needs beside the target of ``pair``, the SRAM a strip of
    ``width`` columns has, what the need counts)."""
    strip = width * fabric.height * fabric.usable_bytes_per_pe
    target, side = pair  # the target maps beside it
    need = _laid(draft, options)
    if isinstance(side, str):  # its weights do not map
        return need, strip, "its weights alone need"
    # The weights fit; the KV room does not.
    held = tokens_per_wafer(target)
    need += held * draft.kv_bytes_per_token()
    return need, strip, f"with KV room for the target's {held:,} tokens it needs"


def _laid(draft: ModelSpec, options: CompileOptions) -> int:
    """The draft's weights its strip holds: an mtp head's layer alone (its ends the
    target's)."""
    return laid_weight_bytes(draft, options.draft == MTP)


def _gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB"


def _enough(pair: tuple) -> bool:
    return _state(pair) == FITS


SHORT, FITS, CROWDED = "short", "fits", "crowded"  # the draft lacks room; both fit; the target


def _state(pair: tuple) -> str:
    """Whether a strip leaves the draft short of room, fits both, or crowds the target."""
    target, side = pair
    if isinstance(target, str):
        return CROWDED
    if isinstance(side, str) or side.regions[0].kv_capacity_tokens < tokens_per_wafer(target):
        return SHORT
    return FITS


def _crowded(model, draft, fabric, width: int, short: tuple, crowded: tuple) -> str:
    """Why no strip holds both: ``width`` columns leave the draft ``short`` of room, one
    more crowds the target."""
    target, side = short
    lacks = side if isinstance(side, str) else (
        f"KV room for {side.regions[0].kv_capacity_tokens:,} tokens where the target's "
        f"regions beside it hold {tokens_per_wafer(target):,}")
    return (f"the draft {draft.name} and {model.name} do not fit {fabric.name} together: a "
            f"strip of {width} columns gives the draft {lacks}, and beside one of "
            f"{width + 1} the target no longer maps ({crowded[0]})")


def draft_summary(target: WaferProgram, side: WaferProgram, fabric, width: int) -> dict:
    """What the draft takes on each wafer that holds it (of ``fabric``): its model, how many
    strips the cluster has, each strip's size, its weights and SRAM, and the target's KV room
    it must match."""
    sram = int(side.sram_total().sum())
    return {"model": side.model.name, "strips": len(strip_systems(target)),
            "strip_columns": width,
            "strip_pes": width * fabric.height,
            "weight_bytes": laid_weight_bytes(side.model, side.options.ends_shared),
            "shares_target_ends": side.options.ends_shared,
            "sram_bytes": sram, "share_of_wafer_pes": width / fabric.width,
            "kv_capacity_tokens": side.regions[0].kv_capacity_tokens,
            "target_kv_capacity_tokens": tokens_per_wafer(target)}
