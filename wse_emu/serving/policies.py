"""Batching policies: how a region picks its next micro-batch.

A policy is a class chosen by name from ``POLICIES``. It owns a dataclass of its knobs (made
of the knob groups below, each knob declared once with ``knobs.knob``) and dispatches twice
over: ``dispatch`` for the plain loop (``plain_loop.Simulation``'s primitives) and
``compiled`` for the compiled loop (``compiled_loop``'s primitives, compiled with the signature
``DISPATCH``), the two line for line alike. A new policy is one class here, registered with
``@register``, and its test (``tests/serving/test_serve_twin.py`` runs every registered policy
through both loops).

Colocated regions serve with the policy the options name. The regions of a disaggregated
split serve first come first served (``PrefillPriority``: a prefill region has no decode
step, a decode region no prompts).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from wse_emu.errors import UserError
from wse_emu.serving.knobs import info, knob
from wse_emu.serving.loops.compiled import (
    admit,
    batch_size,
    compile_dispatch,
    next_prompt,
    queued,
    ready,
    remaining,
    send,
    send_decode,
    serves_prefill,
    started,
    turns,
)


@dataclass(frozen=True)
class Tiles:
    prefill_tile: int = knob(
        64, label="prefill tile", low=1, tune=(8, 16, 32, 64, 128, 256), shown="tile {}",
        phase="prefill", sizes=True,
        help="tokens per prefill micro-batch: a prompt streams through the stages in tiles of "
             "this many, so that it fills the pipeline like a flow shop")


@dataclass(frozen=True)
class Budget:
    token_budget: int = knob(
        256, label="chunk budget", low=1, tune=(16, 32, 64, 128, 256, 512), phase="prefill",
        sizes=True,
        help="chunked prefill: tokens per micro-batch, the ready decode tokens first and the "
             "next prompt's after them")
    chunk_prompts: int = knob(
        1, label="prompts per chunk", low=1, tune=(1,), shown="{} prompts", unshown=1,
        phase="prefill",
        help="chunked prefill: prompts a chunk may take, each to its end but the last, while "
             "the budget lasts (vLLM, SGLang and TensorRT-LLM pack several; 1 by default, as "
             "the published wafer results were tuned)")


@dataclass(frozen=True)
class Turns:
    interleave: int = knob(
        1, label="interleave ratio", low=1, tune=(1, 2, 4),
        help="interleaved: decode micro-batches per prefill tile when both wait")


@dataclass(frozen=True)
class Batching:
    max_running: int = knob(
        0, label="running cap", low=0, tune=(0, 32, 128), shown="cap {}", unshown=0,
        phase="decode",
        help="sequences holding KV at once in a colocated or decode region (0: no cap)")
    batch_limit: int = knob(
        64, label="decode batch limit", low=1, tune=(16, 32, 64), shown="batch {}",
        phase="decode", sizes=True, help="sequences per decode micro-batch")


# Every knob group, in the order the experiment tunes their knobs (and labels show them).
KNOB_GROUPS = (Tiles, Budget, Turns, Batching)


def knob_fields() -> list[dataclasses.Field]:
    """Every serving knob, once, in the order of ``KNOB_GROUPS``."""
    return [f for group in KNOB_GROUPS for f in dataclasses.fields(group)]


class Policy:
    """A batching policy with its knobs (an instance of ``Knobs``)."""

    name: ClassVar[str]
    Knobs: ClassVar[type]

    def __init__(self, knobs=None):
        self.knobs = self.Knobs() if knobs is None else knobs

    @classmethod
    def knob_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls.Knobs))

    @classmethod
    def of(cls, settings) -> "Policy":
        """The policy with its knobs read off ``settings`` (anything with them as
        attributes: ``ServeOptions``, a tuning ``Choice``)."""
        return cls(cls.Knobs(**{name: getattr(settings, name) for name in cls.knob_names()}))

    def title(self) -> str:
        """The policy as a configuration's label shows it."""
        return self.name.replace("-", " ")

    def packed(self) -> np.ndarray:
        """The knobs' values in field order: what ``compiled`` reads."""
        return np.array([getattr(self.knobs, n) for n in self.knob_names()], dtype=np.int64)

    def compiled_dispatch(self):
        return compile_dispatch(type(self).compiled)

    def dispatch(self, sim, r, now: float) -> bool:
        """Start the next micro-batch on region ``r`` of the plain loop ``sim``, if any."""
        raise NotImplementedError

    @staticmethod
    def compiled(st, r, now, knobs):
        """The same for the compiled loop: ``knobs`` are ``packed()``."""
        raise NotImplementedError


POLICIES: dict[str, type[Policy]] = {}


def register(cls: type[Policy]) -> type[Policy]:
    POLICIES[cls.name] = cls
    return cls


def policy_class(name: str) -> type[Policy]:
    if name not in POLICIES:
        raise UserError(f"`policy` must be one of {', '.join(POLICIES)}, got {name!r}")
    return POLICIES[name]


@register
class PrefillPriority(Policy):
    """A waiting prompt goes first, all its tiles at once (each enters the first stage when it
    frees); decode micro-batches when no prompt can be admitted."""

    name = "prefill-priority"

    @dataclass(frozen=True)
    class Knobs(Batching, Tiles):
        pass

    def dispatch(self, sim, r, now):
        i = sim.next_prompt(r)
        if i >= 0 and r.serves_prefill and sim.admit(r, i, now):
            while sim.next_prompt(r) == i:  # the whole prompt, tile after tile
                sim.send(r, now, 0, i, min(self.knobs.prefill_tile, sim.remaining(r, i)))
            return True
        return sim.send_decode(r, now, self.knobs.batch_limit)

    @staticmethod
    def compiled(st, r, now, knobs):
        tile, limit = knobs[0], knobs[2]
        i = next_prompt(st, r)
        if i >= 0 and serves_prefill(st, r) and admit(st, r, i, now):
            while next_prompt(st, r) == i:
                send(st, r, now, 0, i, min(tile, remaining(st, i)))
            return True
        return send_decode(st, r, now, limit)


@register
class Chunked(Policy):
    """Every micro-batch takes the ready decode sequences first and fills the rest of a token
    budget with the next prompt's tokens (and, up to ``chunk_prompts`` prompts, the next
    ones'); its stage times are the decode's and the chunk's, added, or read as one step
    where the pool runs both as one (``pools.Pool.riding``)."""

    name = "chunked"

    @dataclass(frozen=True)
    class Knobs(Batching, Budget):
        pass

    def title(self) -> str:
        return f"chunked {self.knobs.token_budget}"

    def dispatch(self, sim, r, now):
        budget = self.knobs.token_budget
        sequences = min(sim.batch_size(r, min(self.knobs.batch_limit, budget)),
                        len(r.queues.ready))
        room = budget - sequences
        i, tokens = sim.next_prompt(r), 0
        if i >= 0 and room > 0 and (sim.started(r, i) or sim.admit(r, i, now)):
            tokens = min(room, sim.remaining(r, i))
            k = 1  # the prompts behind it, in order, while the budget lasts
            while k < self.knobs.chunk_prompts and tokens < room:
                j = sim.queued(r, k)
                if j < 0 or not (sim.started(r, j) or sim.admit(r, j, now)):
                    break
                tokens += min(room - tokens, sim.remaining(r, j))
                k += 1
        else:
            i = -1
        if not sequences and i < 0:
            return False
        sim.send(r, now, sequences, i, tokens)
        return True

    @staticmethod
    def compiled(st, r, now, knobs):
        budget, prompts, limit = knobs[0], knobs[1], knobs[3]
        sequences = min(batch_size(st, r, min(limit, budget)), ready(st, r))
        room = budget - sequences
        i, tokens = next_prompt(st, r), 0
        if i >= 0 and room > 0 and (started(st, i) or admit(st, r, i, now)):
            tokens = min(room, remaining(st, i))
            k = 1
            while k < prompts and tokens < room:
                j = queued(st, r, k)
                if j < 0 or not (started(st, j) or admit(st, r, j, now)):
                    break
                tokens += min(room - tokens, remaining(st, j))
                k += 1
        else:
            i = -1
        if sequences == 0 and i < 0:
            return False
        send(st, r, now, sequences, i, tokens)
        return True


@register
class Interleaved(Policy):
    """Prefill tiles and decode micro-batches take turns when both wait: ``interleave`` decode
    micro-batches after every tile. A decode token then follows at most one tile through the
    stages (at that tile's pace, since micro-batches never overtake), instead of a whole
    prompt (prefill priority), and never carries prefill work itself (chunked)."""

    name = "interleaved"

    @dataclass(frozen=True)
    class Knobs(Batching, Turns, Tiles):
        pass

    def title(self) -> str:
        ratio = self.knobs.interleave
        return "interleaved" + (f" {ratio}:1" if ratio != 1 else "")

    def dispatch(self, sim, r, now):
        i = sim.next_prompt(r)
        if r.queues.ready and (r.queues.turns < self.knobs.interleave or i < 0):
            return sim.send_decode(r, now, self.knobs.batch_limit)
        if i >= 0 and (sim.started(r, i) or sim.admit(r, i, now)):
            sim.send(r, now, 0, i, min(self.knobs.prefill_tile, sim.remaining(r, i)))
            return True
        return sim.send_decode(r, now, self.knobs.batch_limit)

    @staticmethod
    def compiled(st, r, now, knobs):
        tile, ratio, limit = knobs[0], knobs[1], knobs[3]
        i = next_prompt(st, r)
        if ready(st, r) > 0 and (turns(st, r) < ratio or i < 0):
            return send_decode(st, r, now, limit)
        if i >= 0 and (started(st, i) or admit(st, r, i, now)):
            send(st, r, now, 0, i, min(tile, remaining(st, i)))
            return True
        return send_decode(st, r, now, limit)


# A disaggregated split's prefill and decode regions serve first come first served.
SPLIT_POLICY = PrefillPriority


def knob_info(name: str):
    """The declaration of knob ``name``."""
    for f in knob_fields():
        if f.name == name:
            return info(f)
    raise KeyError(name)


def check_in_tables(values: dict, tops: dict, where: str) -> None:
    """Micro-batch sizes (knob name -> value) must lie within stage tables whose largest
    shapes are ``tops`` (phase -> the largest size they hold; a phase left out is not checked),
    as ``where`` names them: their times are interpolated inside the tables, not guessed
    beyond."""
    sizes = {f.name: info(f).phase for f in knob_fields() if info(f).sizes}
    for name, value in values.items():
        phase = sizes.get(name)  # other settings and knobs are not sizes
        if phase in tops and value > tops[phase]:
            raise UserError(f"`{name}` must be between 1 and {tops[phase]} (the range of "
                            f"{where}), got {value}")
