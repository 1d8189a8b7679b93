"""Batching policies: how a region picks its next micro-batch.

A policy is a class chosen by name from ``POLICIES``. It names the knobs it reads (``reads``;
each knob is declared once, in ``knobs.ServingKnobs``), which also say what it must keep
within a pool's stage tables (``limits``), and dispatches twice over: ``dispatch`` for the
plain loop (``plain_loop.Simulation``'s primitives) and ``compiled`` for the compiled loop
(``compiled_loop``'s primitives, compiled with the signature ``DISPATCH``; it reads its knobs
at the positions ``knobs`` names after them), the two line for line alike. A new policy is one
class here, registered with ``@register``, and its test (``tests/serving/test_serve_twin.py``
runs every registered policy through both loops).

Colocated regions serve with the policy the options name. The regions of a disaggregated
split serve first come first served (``PrefillPriority``: a prefill region has no decode
step, a decode region no prompts).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from wse_emu.errors import UserError
from wse_emu.serving.knobs import (
    BATCH_LIMIT,
    CHUNK_PROMPTS,
    INTERLEAVE,
    KNOB_NAMES,
    PREFILL_TILE,
    TOKEN_BUDGET,
    ServingKnobs,
    info,
    knob_fields,
    knob_info,
    knobs_of,
)
from wse_emu.serving.loops.compiled import (
    admit,
    batch_size,
    compile_dispatch,
    compiled_loop,
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


class Policy:
    """A batching policy with the serving knobs' values (a ``ServingKnobs``), of which it reads
    those it names (``reads``)."""

    name: ClassVar[str]
    # The knobs it serves with, by name: its dispatch reads them, but for the running cap,
    # which the loops read (``running_cap``).
    reads: ClassVar[tuple[str, ...]]

    def __init__(self, knobs: ServingKnobs | None = None):
        self.knobs = ServingKnobs() if knobs is None else knobs

    @classmethod
    def knob_names(cls) -> tuple[str, ...]:
        return cls.reads

    @classmethod
    def of(cls, settings) -> "Policy":
        """The policy with its knobs read off ``settings`` (anything with them as
        attributes: ``ServeOptions``, a tuning ``Choice``)."""
        return cls(knobs_of(settings))

    def title(self) -> str:
        """The policy as a configuration's label shows it."""
        return self.name.replace("-", " ")

    def running_cap(self) -> int:
        """Sequences that may hold KV at once on a pool it serves (0: no cap, as for a policy
        that does not read ``max_running``)."""
        return self.knobs.max_running if "max_running" in self.reads else 0

    def packed(self) -> np.ndarray:
        """Every knob's value in declaration order: what ``compiled`` reads, at the positions
        ``knobs`` names after them (``PREFILL_TILE``, ...)."""
        return np.array([getattr(self.knobs, name) for name in KNOB_NAMES], dtype=np.int64)

    def limits(self, pool) -> list[tuple[str, int, int]]:
        """The micro-batch sizes it sends on ``pool``, as (knob name, value, the largest size
        the pool's stage table of that knob's phase holds): their times are interpolated
        inside the table, never guessed beyond it. A size is a knob it reads that is declared
        one (``KnobInfo.sizes``); a pool without a table of its phase is sent none."""
        out = []
        for name in self.reads:
            declared = knob_info(name)
            table = getattr(pool, declared.phase) if declared.sizes else None
            if table is not None:
                out.append((name, getattr(self.knobs, name), int(table.axis0[-1])))
        return out

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
# Where an arriving request goes among the regions that take prompts: the least busy (after
# the region caching its session's previous call), the next in turn whatever is cached, or
# the one caching the longest prefix of its blocks (a block trace's; else as the least busy).
# Both loops read a router by its place here (``compiled.LEAST_BUSY``...).
ROUTERS = ("least-busy", "round-robin", "prefix")


def register(cls: type[Policy]) -> type[Policy]:
    """Register ``cls`` by its name; a knob it reads that is not declared fails here, at
    import, rather than on its first dispatch."""
    unknown = [name for name in cls.reads if name not in KNOB_NAMES]
    if unknown:
        raise TypeError(f"policy {cls.name} reads undeclared knobs {', '.join(unknown)}")
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
    reads = ("prefill_tile", "max_running", "batch_limit")

    def dispatch(self, sim, r, now):
        i = sim.next_prompt(r)
        # (a prompt at the head is started only when its KV came back from a host tier)
        if i >= 0 and r.serves_prefill and (sim.started(r, i) or sim.admit(r, i, now)):
            while sim.next_prompt(r) == i:  # the whole prompt, tile after tile
                sim.send(r, now, 0, i, min(self.knobs.prefill_tile, sim.remaining(r, i)))
            return True
        return sim.send_decode(r, now, self.knobs.batch_limit)

    @staticmethod
    def compiled(st, r, now, knobs):
        tile, limit = knobs[PREFILL_TILE], knobs[BATCH_LIMIT]
        i = next_prompt(st, r)
        if i >= 0 and serves_prefill(st, r) and (started(st, i) or admit(st, r, i, now)):
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
    reads = ("token_budget", "chunk_prompts", "max_running", "batch_limit")

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
        budget, prompts, limit = knobs[TOKEN_BUDGET], knobs[CHUNK_PROMPTS], knobs[BATCH_LIMIT]
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
    reads = ("prefill_tile", "interleave", "max_running", "batch_limit")

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
        tile, ratio, limit = knobs[PREFILL_TILE], knobs[INTERLEAVE], knobs[BATCH_LIMIT]
        i = next_prompt(st, r)
        if ready(st, r) > 0 and (turns(st, r) < ratio or i < 0):
            return send_decode(st, r, now, limit)
        if i >= 0 and (started(st, i) or admit(st, r, i, now)):
            send(st, r, now, 0, i, min(tile, remaining(st, i)))
            return True
        return send_decode(st, r, now, limit)


# A disaggregated split's prefill and decode regions serve first come first served.
SPLIT_POLICY = PrefillPriority


def warm_loop() -> None:
    """The compiled loop and every policy's dispatch made ready in this process: loaded from
    Numba's cache, or compiled with a line on the command line saying so. Called before
    serving runs go to worker processes, which then load what this wrote, rather than each
    compiling it with nothing said."""
    compiled_loop()
    for cls in POLICIES.values():
        compile_dispatch(cls.compiled)


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
