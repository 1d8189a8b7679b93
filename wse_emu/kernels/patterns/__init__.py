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
by a compile option for any role of kernel (``CompileOptions.patterns``:
``("attention=my_attention",)``); the consistency tests iterate over the registry. The
entries live in the modules of this package, one per kind.
"""

from __future__ import annotations

# The entries register themselves as their modules are imported: all of them, here, before any
# name is looked up.
from wse_emu.kernels.patterns import attention, experts, gather, matrix, route, vector  # noqa: F401
from wse_emu.kernels.patterns.base import PATTERNS, Pattern, Tile, get, register

__all__ = ["PATTERNS", "Pattern", "Tile", "check", "entries", "get", "kind_of", "of", "register"]


def check(options) -> None:
    """The patterns compile ``options`` select are registered for their roles' kinds: an
    unknown name fails here, by name, before anything is compiled."""
    for role, names in options.pattern_names().items():
        for name in set(names.values()):
            get(kind_of(role), name)


def kind_of(role: str) -> str:
    """The kernel kind a role of kernel is (an expert strip is a matrix kernel)."""
    return "matrix" if role == "experts" else role


def of(kernel, phase: str) -> Pattern:
    """The pattern ``kernel`` runs in ``phase``."""
    return get(kernel.kind, kernel.pattern[phase])


def entries() -> list[Pattern]:
    """Every registered pattern, in a fixed order."""
    return [PATTERNS[key] for key in sorted(PATTERNS)]
