"""A wafer region that decodes speculatively, as serving reads it: the draft's stages beside it
come first in its pipeline.

The draft (``WaferProgram.draft``, on its own strip of the wafer) works on a micro-batch before
the target does: for a decode micro-batch it runs its K steps one after another (each a whole
pass through its stages, the next drafted token needing the one before), for a prompt's chunk it
fills its own KV from the chunk, and the verify step's later tiles pass it by. Its stages are
stages of the pool's pipeline, each busy with one micro-batch at a time while the others work on
other micro-batches, as on the wafer: a draft stage holds a decode micro-batch for its share of
all K steps (at the sequences' contexts as they grow by one drafted token per step). Alone, a
micro-batch then takes the K steps' time through the draft, as its steps one after another
would; with others in flight, each draft stage is as busy as its K steps make it. Its tokens
then cross the wafer to the target's first stage.

Every time here is the engine's: the draft's steps from its own stage tables, the target's
first tile from its decode table and the later tiles from its verify table.
"""

from __future__ import annotations

import numpy as np

from wse_emu.serving.tables import StageTable


def with_draft(decode: StageTable | None, prefill: StageTable | None,
               verify: StageTable | None, draft_decode: StageTable, draft_prefill: StageTable,
               draft_tokens: int, hop_cycles: float, ends: StageTable | None = None) -> tuple:
    """The target's decode, prefill and verify tables with the draft's stages before theirs
    (``draft_tokens`` of its steps per decode micro-batch, its prefill per chunk, nothing per
    later verify tile), and between the stages the draft's hops and ``hop_cycles`` more (the
    drafted tokens' trip to the target); None stays None. A draft that shares the target's
    embedding and LM head (``ends``, a shared-ends table: ``sim.shared_ends``) keeps the
    target's stages that hold them busy for each of its steps too, and adds its trips to them."""
    def steps(a: float, b: float) -> np.ndarray:
        return sum(draft_decode.vector(a, b + j)[:-1] for j in range(draft_tokens))

    def chunk(a: float, b: float) -> np.ndarray:
        return draft_prefill.vector(a, b)[:-1]

    def passed(a: float, b: float) -> np.ndarray:
        return np.zeros(len(draft_decode.cycles) + 1)

    return (_after(_with_ends(decode, ends, draft_tokens), steps, hop_cycles),
            _after(prefill, chunk, hop_cycles), _after(verify, passed, 0.0))


def _with_ends(table: StageTable | None, ends: StageTable | None,
               draft_tokens: int) -> StageTable | None:
    """The target's decode ``table`` with ``draft_tokens`` of the draft's passes through its
    embedding and LM head (``ends``, at each of the table's batches) added to the stages that
    hold them, and their trips to the transfers: on the wafer, those stages' PEs work for the
    draft and the target in turn."""
    if table is None or ends is None:
        return table
    context = float(ends.axis1[0])  # they do not read the KV cache
    add = draft_tokens * np.array([ends.vector(float(a), context) for a in table.axis0])
    return StageTable(table.phase, table.axis0, table.axis1,
                      table.cycles + add[:, :-2].T[:, :, None],
                      table.transfers + add[:, -2][:, None])


def _after(table: StageTable | None, draft, hop_cycles: float) -> StageTable | None:
    """``table`` with the draft's stages first: ``draft(a, b)`` gives their cycles and then
    the cycles between them, in all."""
    if table is None:
        return None
    parts = np.array([[draft(float(a), float(b)) for b in table.axis1] for a in table.axis0])
    stages = np.moveaxis(parts[:, :, :-1], -1, 0)
    return StageTable(table.phase, table.axis0, table.axis1,
                      np.concatenate([stages, table.cycles]),
                      table.transfers + parts[:, :, -1] + hop_cycles)


def hop_to_target(program, region) -> float:
    """The drafted tokens' trip from the draft's strip, at the far side of ``region``'s last
    wafer, to the target's first stage: across the columns the strip leaves (an upper bound
    on the hops; the token ids are a few wavelets), and off that wafer and onto the first
    stage's when a replica spans wafers."""
    fabric = program.fabric
    columns = fabric.width - program.options.reserved_columns
    cycles = columns * fabric.hop_latency_cycles + 2 * fabric.ramp_latency_cycles
    if region.parts[0].system != region.parts[-1].system:
        cycles += 2 * fabric.ramp_latency_cycles + 1  # out through the I/O edge and in
    return float(cycles)


REFERENCE_CONTEXT = 4096  # the shape one verify round is reported at: one sequence, this context


def step_alone(pool, draft_stages: int, clock_hz: float,
               context: int = REFERENCE_CONTEXT) -> dict:
    """One sequence's verify round alone on ``pool`` at ``context``, in seconds: the draft's K
    steps (its ``draft_stages`` first stages) and the target's verify step (its first tile's
    trip, then each later tile at its slowest stage's pace). The hops between all the
    stages, the draft's among them, count with the verify step: the draft's share is a
    little below its true one. A draft's passes through the target's embedding and LM head
    (``StagePool.draft_ends``), and their trips, count as the draft's."""
    first = pool.decode.vector(1, context)
    later = pool.verify.vector(1, context)
    ends = 0.0
    if pool.draft_ends is not None:
        v = pool.draft_ends.vector(1, float(pool.draft_ends.axis1[0]))
        ends = pool.draft_tokens * float(v[:-2].sum() + v[-2])
    draft = float(first[:draft_stages].sum()) + ends
    verify = float(first[draft_stages:-2].sum() + first[-2]) - ends \
        + pool.draft_tokens * float(later[draft_stages:-2].max())
    return {"batch": 1, "context": context, "draft_s": draft / clock_hz,
            "verify_s": verify / clock_hz}
