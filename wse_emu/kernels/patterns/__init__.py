"""Kernel patterns: how each kind of kernel runs on its PEs, one registry entry per pattern.

A compiled kernel names, per phase, the pattern it runs (``Kernel.pattern``: a decode GEMV
reduced by trees, a prefill GEMM streaming its tiles, the KV cache spread over a stage, ...).
Everything that depends on how a kernel runs lives in its pattern's entry, and every consumer
dispatches on the registry instead of switching on the kernel's kind:
- ``plan``: the compiler's part, the kernel itself with its SRAM (weights and buffers per PE)
  and the routes of its collectives, laid on the rectangle the stage layout gave it;
- ``bound``: its analytic lower bound for one step (``bounds.result``);
- ``expand``: its task graph for one tile of a step, given explicitly (``Tile``: the
  micro-batch, the layer of the stage, what earlier tiles left), added to a stage's graph
  (``kernels.stage.StageGraph`` walks the layer's ops and hands each its inputs); ``alone``:
  the kernel by itself with its inputs present at cycle 0, to time it against its bound;
- ``load`` and ``compute``: the functional engine's part, the kernel's weights as its PEs
  hold them and the numbers it computes from its inputs, as its dataflow would.

A new pattern is a subclass of its kind's class registered here (``register``) and selected
by a compile option (``CompileOptions.matrix_patterns`` for dense matrix strips); the
consistency tests iterate over the registry. The entries live in the modules of this
package, one per kind.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from wse_emu.errors import UserError
from wse_emu.layer import MicroBatch

PATTERNS: dict[tuple[str, str], "Pattern"] = {}


@dataclass(frozen=True)
class Tile:
    """What one pass of a stage's ops works on: a tile of the step (a prefill's token tile, a
    decode's batch or one of its attention tiles), the layer of the stage (0 = its first),
    and, for attention across a prefill's tiles, the tasks that placed the earlier tiles'
    keys (per layer) and where this tile's are noted."""

    step: MicroBatch
    layer: int = 0
    keys_before: dict | None = None
    keys_placed: dict = field(default_factory=dict)

    def at_layer(self, layer: int) -> "Tile":
        return replace(self, layer=layer)

    def with_step(self, step: MicroBatch) -> "Tile":
        return replace(self, step=step)


class Pattern:
    """One way a kernel kind runs. Subclasses set ``kind`` and ``name`` and implement what
    their kind's callers use (see the module's docstring)."""

    kind: str = ""
    name: str = ""

    def bound(self, kernel, ops: list, model, fabric, mb: MicroBatch,
              layers: range | None = None, part: tuple[int, int] | None = None) -> dict:
        """Lower bound on one execution of ``kernel`` (running ``ops``, its ops of the layer
        description) for one layer of step ``mb`` (the cheapest of ``layers``, the model
        layers it serves, where they differ; ``part``: the experts of a split layer its
        stage holds): ``kernels.bounds.result``."""
        raise NotImplementedError

    def alone(self, sg, kernel, tile: Tile) -> None:
        raise NotImplementedError

    def load(self, fs, kernel, op, weights, layers: range) -> None:
        """The functional engine's part: the kernel's weights (of ``op``, in ``layers``) as
        its PEs hold them, kept on ``fs`` (a ``functional.region.FunctionalStage``); nothing
        by default (a kernel without weights)."""

    def compute(self, fs, op, index: int, *inputs):
        """What ``op`` computes on this kernel in layer ``index`` of the stage, from its
        inputs' values (tokens x features)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<pattern {self.kind}/{self.name}>"


def register(pattern: Pattern) -> Pattern:
    """Add ``pattern`` to the registry under (kind, name); a name is registered once."""
    key = (pattern.kind, pattern.name)
    if key in PATTERNS and type(PATTERNS[key]) is not type(pattern):
        raise ValueError(f"kernel pattern {pattern.kind}/{pattern.name} is registered twice")
    PATTERNS[key] = pattern
    return pattern


def get(kind: str, name: str) -> Pattern:
    """The registered pattern ``name`` of kernel kind ``kind``."""
    _load_entries()
    try:
        return PATTERNS[(kind, name)]
    except KeyError:
        known = ", ".join(n for k, n in sorted(PATTERNS) if k == kind)
        raise UserError(f"no kernel pattern {name!r} for {kind} kernels (known: {known})") \
            from None


def of(kernel, phase: str) -> Pattern:
    """The pattern ``kernel`` runs in ``phase``."""
    return get(kernel.kind, kernel.pattern[phase])


def entries() -> list[Pattern]:
    """Every registered pattern, in a fixed order."""
    _load_entries()
    return [PATTERNS[key] for key in sorted(PATTERNS)]


def _load_entries() -> None:
    """The package's own entries register themselves when their modules are imported."""
    from wse_emu.kernels.patterns import (  # noqa: F401
        attention,
        experts,
        gather,
        matrix,
        route,
        vector,
    )
