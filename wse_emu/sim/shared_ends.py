"""What a draft that shares its target's embedding and LM head costs the target per drafted token.

An mtp draft (``compiler.draft``) is one decoder layer on a strip of its own; as published
multi-token-prediction and EAGLE heads do, it reads its input token's embedding from the
target's table and turns its output into a token with the target's LM head. Each of its steps
therefore runs the target's embedding and LM-head kernels once more, at the draft's
micro-batch, on the target's PEs: each kernel is timed by the engine alone (its inputs present
at its start), and the vectors travel between the strip and those kernels: the draft's output
to the LM head, the token it picks to the embedding, that token's embedding back to the strip.
"""

from __future__ import annotations

from wse_emu.models import layer as ly
from wse_emu.models.layer import MicroBatch
from wse_emu.program.format import Stage, WaferProgram
from wse_emu.sim.runner import kernel_cycles, trip_cycles

TOKEN_BYTES = 4  # a token id on the fabric: one wavelet


def end_ops(model) -> frozenset[str]:
    """The ops of the model's ends: its embedding lookup and its final norm and LM head."""
    return frozenset(op.name for op in ly.input_ops(model) + ly.output_ops(model))


def ends_cycles(program: WaferProgram, stage: Stage, step: MicroBatch, engine: str) -> int:
    """The cycles of ``stage``'s kernels of the model's ends (none, in a stage between them)
    for one drafted token of each of ``step``'s sequences, each kernel alone, one after
    another."""
    ops = end_ops(program.model)
    return sum(kernel_cycles(program, stage, k.name, step, engine)
               for k in program.stage_kernels(stage) if ops.intersection(k.ops))


def trips_cycles(program: WaferProgram, region: str, step: MicroBatch) -> int:
    """The trips of one drafted token per sequence of ``step`` between the draft's strip (at
    the far side of the region's last wafer) and the target's ends: its output vector to the
    LM head, the token to the embedding, the token's embedding back to the strip."""
    side = program.draft
    fabric, model = program.fabric, program.model
    stages = [program.stages[i] for i in program.region(region).stage_ids]
    kernels = {k.name: k for s in stages for k in program.stage_kernels(s)}
    head, emb = kernels["lm_head"], kernels["embedding"]
    # The strip's home kernels, where the draft's input enters and its output leaves, in the
    # target's wafer coordinates.
    home = ly.home_site(side.model)
    strip_stages = [side.stages[i] for i in side.regions[0].stage_ids]
    enter = next(k for k in side.stage_kernels(strip_stages[0]) if k.name == home)
    leave = next(k for k in side.stage_kernels(strip_stages[-1]) if k.name == home)
    system = program.region(region).parts[-1].system
    x0 = fabric.width - program.options.reserved_columns  # the strip's first column

    def on_strip(k) -> tuple:
        cx, cy = k.rect.center()
        return system, cx + x0, cy

    def at(k) -> tuple:
        cx, cy = k.rect.center()
        return k.rect.system, cx, cy

    tokens = step.new_tokens
    h, d = model.hidden_size, model.storage.dtype_bytes
    return (trip_cycles(fabric, on_strip(leave), at(head), h, leave.grid[1], tokens, d)
            + trip_cycles(fabric, at(head), at(emb), 1, 1, tokens, TOKEN_BYTES)
            + trip_cycles(fabric, at(emb), on_strip(enter), h, enter.grid[1], tokens, d))
