"""The registry of kernel patterns: the base class a pattern derives from, what one pass of a
stage works on (``Tile``), and the entries by (kind, name). The package's ``__init__`` imports
every entry module, so a name is looked up only once all are registered."""


from __future__ import annotations

from dataclasses import dataclass, field, replace

from wse_emu.errors import UserError
from wse_emu.models.layer import MicroBatch

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
    their kind's callers use (see the package's docstring, ``kernels.patterns``)."""

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
        its PEs hold them, kept on ``fs`` (a ``sim.functional.region.FunctionalStage``); nothing
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
    try:
        return PATTERNS[(kind, name)]
    except KeyError:
        known = ", ".join(n for k, n in sorted(PATTERNS) if k == kind)
        raise UserError(f"no kernel pattern {name!r} for {kind} kernels (known: {known})") \
            from None
