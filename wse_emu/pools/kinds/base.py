"""What a kind of hardware a pool may be named by (``pools.names``) answers: the face
``PoolKind`` describes (and ``ServerKind``, its common answers for accelerators and GPUs), and
``Side``, a pool as named in one of its layouts. Nothing outside the kinds' own modules asks
which kind a pool is: naming, the footprint, the layouts an experiment tries and the pools
that serve all go through this face."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from wse_emu.errors import UserError
from wse_emu.serving.knobs import EngineKnobs
from wse_emu.serving.tables import SERVER_AXES, grid_axes

# What servers of continuous batching run with on accelerators and GPUs (vLLM, SGLang,
# TensorRT-LLM; on Trainium, vLLM over NxD Inference): a step of up to 8,192 tokens (vLLM's
# max_num_batched_tokens, TensorRT-LLM's max_num_tokens, SGLang's chunked_prefill_size reach
# it; AIConfigurator's aggregated plans step 8,192 context tokens at a time) and up to 256
# sequences at once (vLLM's max_num_seqs and trtllm-serve's max_batch_size default to 256),
# several prompts packed into one chunk while its budget lasts, and a prompt prefilled whole
# where chunking is off. Tuning starts where those servers start: chunks of 8,192 tokens,
# batches of 256. The tables of such pools span it (``tables.SERVER_AXES``).
SERVER_KNOBS = EngineKnobs(
    values=(("prefill_tile", (256, 1024, 2048, 4096, 8192)),
            ("token_budget", (256, 512, 1024, 2048, 4096, 8192)),
            ("chunk_prompts", (1, 4)),
            ("max_running", (0, 32, 128, 256)),
            ("batch_limit", (16, 32, 64, 128, 256))),
    start=(("prefill_tile", 8192), ("token_budget", 8192), ("batch_limit", 256)))


class PoolKind(ABC):
    """What the rest of the project reads of a kind of hardware: a kind must say what the
    abstract methods ask; the others have the answer most kinds give."""

    noun = ""  # as an error message lists it: "a fabric"
    order = 100  # where its names are tried and listed among the kinds (lowest first)
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
              cache: Path, grid: str, reach: int = 0) -> list:
        """The ``StagePool`` of every copy of ``model`` on ``side`` in ``role``, its systems
        numbered from ``first``, its steps timed for a serving clock of ``clock_hz``; stage
        tables kept in ``cache`` over ``grid``'s shapes, contexts timed as far as ``reach``
        tokens (a kind whose tables span every context a model has may ignore it)."""

    @abstractmethod
    def step_times_source(self, hardware: Any) -> str:
        """Where its step times come from, in a few words (a run states it)."""

    def engine_knobs(self) -> EngineKnobs:
        """The serving knobs' values its serving engines use, which the experiment's default
        search tries on its pools (the knobs' declarations where it names none)."""
        return EngineKnobs()

    def table_axes(self, grid: str, phase: str) -> tuple:
        """The micro-batch shapes its pools' tables for ``phase`` are timed at, given the
        experiment's ``grid`` ("full" or "quick")."""
        return grid_axes(grid, phase)

    def tables_named(self, grid: str) -> str:
        """Its tables' range as a message names it."""
        return f"the stage tables' {grid} grid"

    def table_tops(self, grid: str) -> dict:
        """Phase -> the largest micro-batch size its tables hold (``policies.check_in_tables``
        keeps sizes within)."""
        return {phase: int(self.table_axes(grid, phase)[0][-1])
                for phase in ("prefill", "decode")}


class ServerKind(PoolKind, ABC):
    """A kind whose steps are timed by a formula or from measured data (accelerators, GPUs),
    served as servers of continuous batching serve it (``SERVER_KNOBS``), its tables over the
    sizes those run (``SERVER_AXES``, whatever the grid: a shape costs next to nothing)."""

    def engine_knobs(self) -> EngineKnobs:
        return SERVER_KNOBS

    def table_axes(self, grid: str, phase: str) -> tuple:
        grid_axes(grid, phase)  # an unknown grid is refused all the same
        return SERVER_AXES[phase]

    def tables_named(self, grid: str) -> str:
        return f"{self.noun}'s stage tables"


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
