"""The kinds of hardware a pool may be named by (``pool_names``): wafers compiled and simulated
(``wafer``), accelerators timed by a stated roofline (``accelerator``), GPUs timed from measured
data (``gpu``). Each kind is one module with the face ``PoolKind`` describes, and nothing
outside them asks which kind a pool is: naming, the footprint, the layouts an experiment tries
and the pools that serve all go through it. A new kind is a module here and a line in
``kinds``."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from wse_emu.errors import UserError


class PoolKind(ABC):
    """What the rest of the project reads of a kind of hardware: a kind must say what the
    abstract methods ask; the others have the answer most kinds give."""

    noun = ""  # as an error message lists it: "a fabric"
    takes_tp = False  # whether its names may say GPUs per copy (``h200x8tp2``)
    # What marks a YAML file of this kind, as an error names it ("": it has no files).
    file_mark = ""
    # Whether a file no other kind claims is read as this kind (one kind is): its loader
    # then says what the file lacks.
    default_file = False

    @abstractmethod
    def presets(self) -> list[str]:
        """The names it answers to on the command line."""

    @abstractmethod
    def load(self, name: str) -> Any:
        """The hardware a preset name stands for."""

    def describes(self, mapping: dict) -> bool:
        """Whether a YAML file holding ``mapping`` describes this kind (``file_mark``)."""
        return False

    def load_file(self, path: Path) -> Any:
        """The hardware a YAML file describes (only a kind with a ``file_mark`` has files)."""
        raise UserError(f"{path}: {self.noun} is not described by a file")

    @abstractmethod
    def owns(self, hardware: Any) -> bool:
        """Whether ``hardware`` (as ``load`` gives it) is of this kind."""

    def per_system(self, hardware: Any) -> int:
        """Units of it that make one system (GPUs share a node; a wafer is one)."""
        return 1

    @abstractmethod
    def power_w(self, hardware: Any) -> float:
        """Wall power of one unit (0 where no figure is stated)."""

    def clock_hz(self, hardware: Any) -> float | None:
        """The clock its own step times count in (None: it times steps in seconds)."""
        return None

    def variants(self, name, model, copies: tuple, depths: tuple) -> list["Side"]:
        """Every layout a pool named ``name`` may take for ``model`` (an experiment tries
        each); ``copies`` per system and ``depths`` (layers per stage) where it has them."""
        return [Side(name)]

    @abstractmethod
    def label(self, side: "Side") -> str:
        """How a report names one side."""

    @abstractmethod
    def pools(self, model, side: "Side", role: str, first: int, clock_hz: float,
              cache: Path, grid: str, compile_model) -> list:
        """The ``StagePool`` of every copy of ``model`` on ``side`` in ``role``, its systems
        numbered from ``first``, its steps timed for a serving clock of ``clock_hz``; stage
        tables kept in ``cache`` over ``grid``'s shapes. ``compile_model(model, fabric,
        systems, **options)`` is the compiler (``wse_emu.api.compile``), given for a kind
        that compiles the model onto its hardware: the core does not import it."""

    @abstractmethod
    def step_times_source(self, hardware: Any) -> str:
        """Where its step times come from, in a few words (a run states it)."""


@dataclass(frozen=True)
class Side:
    """One side of a plan: a pool as named (a ``PoolName``), in one of its layouts: at a
    tensor parallel degree (GPUs), with so many copies per system and layers per stage
    (wafers)."""

    pool: Any
    tp: int | None = None
    copies: int = 1  # per wafer
    depth: int | None = None  # a wafer's layers per stage (None: as compiled)

    @property
    def label(self) -> str:
        return self.pool.kind.label(self)


def kinds() -> tuple:
    """Every kind, in the order names are tried and listed."""
    # Imported here: the kinds' modules import the pools they build, which import this one.
    from wse_emu.pool_kinds.accelerator import ACCELERATOR
    from wse_emu.pool_kinds.gpu import GPU
    from wse_emu.pool_kinds.wafer import WAFER

    return (WAFER, ACCELERATOR, GPU)


def kind_of(hardware: Any) -> PoolKind:
    """The kind ``hardware`` (a fabric, an accelerator, a GPU) is of."""
    for kind in kinds():
        if kind.owns(hardware):
            return kind
    raise TypeError(f"no pool kind holds {type(hardware).__name__}")
