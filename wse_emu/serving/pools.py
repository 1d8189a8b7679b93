"""Pools: what serving needs of a place that runs the model.

A pool has a role (``mixed`` for colocated serving, ``prefill`` or ``decode`` for a split), a
pipeline of stages with their times by micro-batch shape (``StageTable``s: a prefill tile of
so many tokens after so many cached, a decode step of so many sequences at a mean context), a
KV capacity, and the links its KV handoffs use: a transfer to another pool of the same system
crosses that system's fabric, one to another system leaves over this system's own link and
arrives over the other's, one transfer at a time on each (their contention), and reaches it
after the network's latency (the larger of the two ends'). Serving reads nothing else, so a
pool of another kind (an accelerator described by measured step times) is one more class
with these attributes.

Each kind of hardware builds its pools above this layer (``wse_emu.pools.kinds``): a compiled
wafer region is a ``kinds.wafer.WaferRegion``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from wse_emu.serving.knobs import EngineKnobs
from wse_emu.serving.tables import StageTable

ROLES = ("mixed", "prefill", "decode")
PHASES = {"mixed": ("prefill", "decode"), "prefill": ("prefill",), "decode": ("decode",)}


class Pool(Protocol):
    name: str
    role: str  # mixed, prefill or decode
    kv_capacity_tokens: int
    prefill: StageTable | None  # cycles per stage of a prefill tile (None: no prefill here)
    decode: StageTable | None  # ... of a decode micro-batch (None: no decode here)
    # A decode micro-batch's share of a step it shares with a prompt's chunk (chunked
    # serving), where one step runs both: the chunk's table is then read at the chunk's
    # tokens and the sequences' together, since its matrices multiply them in one pass.
    # None: the two are timed apart and added (a wafer's pipeline runs them as two passes
    # of its stages' kernels).
    riding: StageTable | None
    # Speculative decoding (optional; a pool without these decodes one token per step): the
    # drafted tokens a verify step checks, and each later tile's cycles per stage, following
    # the first through the stages (its first tile is read off ``decode``, the draft's steps
    # before it in the draft's own stages at the front of the pipeline).
    # verify: StageTable | None
    # draft_tokens: int
    system: int  # which system it sits on: its handoffs' links are that system's
    fabric_bytes_per_cycle: float  # a handoff to a pool of the same system
    link_bytes_per_cycle: float  # ... to another system, each way, over this system's link
    link_latency_cycles: float  # ... and its network's one-way latency (the larger end's)

    @property
    def stages(self) -> int: ...


@dataclass
class StagePool:
    """A pool as serving reads it (``Pool``): what a wafer region, an accelerator's copy of the
    model or a GPU's is made into."""

    name: str
    role: str
    kv_capacity_tokens: int
    prefill: StageTable | None
    decode: StageTable | None
    system: int = 0
    # A handoff to a pool of the same system, and out of it to another, in bytes per cycle.
    fabric_bytes_per_cycle: float = float("inf")
    link_bytes_per_cycle: float = float("inf")
    riding: StageTable | None = None
    link_latency_cycles: float = 0.0
    # The knob values its kind's serving engines use: what an experiment tries on it by default
    # (serving itself never reads it).
    engine: EngineKnobs = field(default_factory=EngineKnobs)
    # Speculative decoding (``Pool``): each later tile of a verify step, and the drafted tokens.
    verify: StageTable | None = None
    draft_tokens: int = 0
    draft_stages: int = 0  # the draft's, first in its pipeline (``pools.speculative``)
    # A draft that shares the target's embedding and LM head: its passes through them per
    # drafted token (``tables.ENDS``), already counted in ``decode``'s stages that hold them.
    draft_ends: StageTable | None = None

    @property
    def stages(self) -> int:
        return len((self.prefill or self.decode).cycles)
