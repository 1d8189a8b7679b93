"""One step of a compiled program as a user asks for it: its arguments checked by name
(``runner.check_step``), the region and the step refused by name where they run past the
model's positions (``step_of``), and the step simulated (``run_step``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from wse_emu.errors import UserError
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


@dataclass(frozen=True)
class StepShape:
    """The shape of one step, as ``run_step`` (and ``api.run``) take it by name: a decode of
    ``batch`` sequences at ``context`` cached tokens each, verifying ``draft_tokens`` drafted
    tokens per sequence after its next (speculative decoding; 0: a plain decode), or a
    prefill of ``tokens`` in ``tiles`` token tiles."""

    batch: int = 1
    context: int = 4096
    tokens: int = 4096
    tiles: int = DEFAULT_PREFILL_TILES
    draft_tokens: int = 0


def step_of(program: WaferProgram, phase: str, region: str | None = None, *, batch: int = 1,
            context: int = 4096, tokens: int = 4096, tiles: int = DEFAULT_PREFILL_TILES,
            draft_tokens: int = 0) -> tuple[str, MicroBatch]:
    """``runner.step_for``'s region and step, refused by name if it runs past the model's
    positions: a decode at ``context`` attends over that many (its own token's included;
    a verify step's last drafted token over ``draft_tokens`` more), a prefill of ``tokens``
    fills as many."""
    if phase == "decode":
        last = whole("context", context, 1) + whole("draft_tokens", draft_tokens, 0)
        check_positions(program.model, last, f"a decode step at `context={context}`" + (
            f" verifying `draft_tokens={draft_tokens}`" if draft_tokens else ""))
    elif phase == "prefill":
        check_positions(program.model, whole("tokens", tokens, 1),
                        f"a prompt of `tokens={tokens}`")
    return step_for(program, phase, region, batch=batch, context=context, tokens=tokens,
                    tiles=tiles, draft_tokens=draft_tokens)


def run_step(program: WaferProgram, phase: str, region: str | None = None,
             engine: str = "fast", reuse: bool = True, progress=None, **shape) -> RegionRun:
    """One step of ``phase`` on ``region`` of ``program`` (by default the first that serves
    the phase), of the ``shape`` asked (``batch``, ``context``, ``tokens``, ``tiles``,
    ``draft_tokens``), every argument checked first; ``reuse``: stages alike timed once;
    ``progress(done, total)`` as stages finish."""
    names = [f.name for f in fields(StepShape)]
    unknown = next((name for name in shape if name not in names), None)
    if unknown is not None:
        raise UserError(f"`{unknown}` is not a step's shape: give {', '.join(names)}")
    asked = asdict(StepShape(**shape))  # each checked by check_step, by name
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
