"""One step of a compiled program as a user asks for it: its arguments checked by name
(``runner.check_step``), the region and the step refused by name where they run past the
model's positions (``step_of``), and the step simulated (``run_step``)."""

from __future__ import annotations

from wse_emu.models.layer import MicroBatch
from wse_emu.models.spec import check_positions
from wse_emu.program.format import WaferProgram
from wse_emu.sim.runner import (
    DEFAULT_PREFILL_TILES,
    HandoffRun,
    RegionRun,
    check_step,
    handoff_for,
    kv_handoff,
    run_region,
    step_for,
)
from wse_emu.sim.warm import warm_engine
from wse_emu.util.checks import whole


def step_of(program: WaferProgram, phase: str, region: str | None = None, *, batch: int = 1,
            context: int = 4096, tokens: int = 4096,
            tiles: int = DEFAULT_PREFILL_TILES) -> tuple[str, MicroBatch]:
    """``runner.step_for``'s region and step, refused by name if it runs past the model's
    positions: a decode at ``context`` attends over that many (its own token's included),
    a prefill of ``tokens`` fills as many."""
    if phase == "decode":
        check_positions(program.model, whole("context", context, 1),
                        f"a decode step at `context={context}`")
    elif phase == "prefill":
        check_positions(program.model, whole("tokens", tokens, 1),
                        f"a prompt of `tokens={tokens}`")
    return step_for(program, phase, region, batch=batch, context=context, tokens=tokens,
                    tiles=tiles)


def run_step(program: WaferProgram, phase: str, region: str | None = None,
             engine: str = "fast", reuse: bool = True, progress=None, **shape) -> RegionRun:
    """One step of ``phase`` on ``region`` of ``program`` (by default the first that serves
    the phase), of the ``shape`` asked (``batch``, ``context``, ``tokens``, ``tiles``), every
    argument checked first; ``reuse``: stages alike timed once; ``progress(done, total)``
    as stages finish."""
    asked = {"batch": 1, "context": 4096, "tokens": 4096, "tiles": DEFAULT_PREFILL_TILES,
             **shape}
    check_step(phase, engine=engine, **asked)
    name, step = step_of(program, phase, region, **asked)
    warm_engine(engine)  # a first compile said, not waited through in silence
    return run_region(program, name, step, engine, reuse=reuse, progress=progress)


def handoff(program: WaferProgram, tokens: int = 4096, region: str | None = None) -> HandoffRun:
    """The KV cache of a ``tokens``-long prompt moved from a prefill region of a disaggregated
    ``program`` (``region``, by default the first) to a decode region."""
    check_positions(program.model, whole("tokens", tokens, 1), f"a prompt of `tokens={tokens}`")
    src, dst = handoff_for(program, region, tokens)
    return kv_handoff(program, src, dst, tokens)
