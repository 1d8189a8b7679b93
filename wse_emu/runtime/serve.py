"""Serving requests on regions, event by event (the execution model of the design notes).

A region is a pipeline of stages. A micro-batch (a tile of up to ``prefill_tile`` tokens of one
prompt, or one new token for each of up to ``batch_limit`` sequences) enters stage 0 when it is
free, holds each stage for that stage's time (from the region's stage-time tables) and moves on;
micro-batches never overtake each other. A sequence's next token can enter only after its
previous one left the last stage.

Colocated regions serve both phases with prefill priority: a waiting prompt goes before any
decode micro-batch. With chunked prefill instead, every micro-batch takes the ready decode
sequences first and fills the rest of a token budget with the next prompt's tokens; its stage
times are the decode's and the prefill chunk's, added. Interleaved, prefill tiles and decode
micro-batches stay separate and take turns when both wait (``interleave`` decode micro-batches
to a prefill tile). Disaggregated, prefill regions serve prompts first come first served, and a
finished prompt's KV cache moves to a decode region with room for it; decode regions run decode
micro-batches. A handoff inside a wafer crosses the fabric between the regions; between wafers
it leaves over the sending wafer's off-wafer link and arrives over the receiving wafer's,
holding both (the links are full duplex, so a wafer sends and receives at once); each link
carries one sequence's KV after another. A region admits a sequence only when its KV fits (the
whole sequence's in a colocated or decode region, the prompt's in a prefill region) and, with a
cap on running sequences, when fewer than the cap hold KV there.

Agentic sessions send each call the whole context so far. With the prefix cache, a region
keeps a finished call's KV (a colocated region the call's prompt and output, a prefill region
the prompt it handed off) until it needs the room, least recently used first; the session's
next call goes to that region and computes only the tokens after the cached prefix. Decode
regions keep nothing: the next call's prefill runs elsewhere.

Each region also counts its decode stall: the time its tokens spent beyond their own decode
work (waiting for stage 0, behind other micro-batches, or carrying a prefill chunk). It is what
colocation costs decode, and what disaggregation is meant to remove.
"""

from __future__ import annotations

import heapq
from array import array
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from wse_emu.errors import UserError
from wse_emu.runtime.flowshop import advance
from wse_emu.runtime.tables import StageTable
from wse_emu.runtime.workload import Requests


@dataclass
class RegionModel:
    """What the runtime needs of a region: its role, KV capacity and stage-time tables."""

    name: str
    role: str  # mixed, prefill or decode
    kv_capacity_tokens: int
    prefill: StageTable | None
    decode: StageTable | None
    system: int = 0  # the wafer it sits on (KV handoffs leave over that wafer's link)


POLICIES = ("prefill-priority", "chunked", "interleaved")  # for colocated regions


@dataclass(kw_only=True)
class ServeOptions:
    """How requests are served. The hardware's numbers have no defaults: ``ServeOptions.of``
    takes them from the fabric and the model; the rest are the serving knobs."""

    clock_hz: float
    handoff_bytes_per_cycle: float  # KV handoffs between regions of one wafer
    offwafer_bytes_per_cycle: float  # ... between wafers, each way, per wafer
    kv_bytes_per_token: int  # KV cache bytes per token (all layers)
    batch_limit: int = 64
    policy: str = "prefill-priority"  # colocated regions: or "chunked" or "interleaved"
    token_budget: int = 512  # chunked prefill: tokens per micro-batch
    # Prompts go through the pipeline as micro-batches of at most this many tokens, so that a
    # long prompt fills the stages like a flow shop instead of holding each one in turn.
    prefill_tile: int = 64
    max_running: int = 0  # sequences holding KV in a colocated or decode region (0: no cap)
    interleave: int = 1  # interleaved policy: decode micro-batches per prefill tile
    prefix_cache: bool = True  # reuse a session's KV still resident from its previous call
    timeline_events: int = 0  # stage events kept per region for the timeline (0: none)

    @classmethod
    def of(cls, fabric, model, **knobs) -> ServeOptions:
        """Options for ``model`` (a ModelSpec) on ``fabric`` (a FabricSpec): its clock; KV
        handoffs inside a wafer across the fabric at the boundary between regions (4 bytes per
        row per cycle), between wafers over the off-wafer links."""
        return cls(clock_hz=fabric.clock_hz,
                   handoff_bytes_per_cycle=float(fabric.height * fabric.link_bytes_per_cycle),
                   offwafer_bytes_per_cycle=fabric.offwafer_bytes_per_cycle(),
                   kv_bytes_per_token=model.kv_bytes_per_token(), **knobs)


@dataclass
class _Pipeline:
    model: RegionModel
    free: np.ndarray  # cycle each stage next becomes free
    starts: np.ndarray  # when the last micro-batch started each stage
    kv_used: int = 0
    prefills: list = field(default_factory=list)  # request ids waiting, in order
    progress: dict = field(default_factory=dict)  # prompt tokens done, of prompts under way
    busy: dict = field(default_factory=lambda: {"prefill": 0.0, "decode": 0.0})  # stage-cycles
    stall: float = 0.0  # decode: token-cycles spent beyond the tokens' own decode work
    work: float = 0.0  # decode: token-cycles of the tokens' own decode work
    decoded: int = 0  # decode tokens made here
    in_flight: int = 0  # sequences whose next token is in the pipeline
    kv_trace: list = field(default_factory=list)  # (cycle, KV tokens held) after each change
    events: list = field(default_factory=list)  # (stage, start, end, label) for the timeline
    max_events: int = 0
    ready: list = field(default_factory=list)  # (sequence, context, since when) for a token
    busy_until: float = 0.0
    kv_blocked: float = 0.0  # cycles the prompt at the head of this region's queue (or of its
    # handoffs) waited for KV room
    blocked_since: float | None = None  # when the prompt at the head began waiting for room
    decodes_since_prefill: int = 1 << 30  # interleaved policy: whose turn it is
    running: int = 0  # sequences holding KV here (admitted or handed over, not finished)
    cache: dict = field(default_factory=dict)  # session -> (call, KV tokens), oldest first
    cached: int = 0  # KV tokens in the cache (given up when admission needs the room)
    reused: int = 0  # prompt tokens not computed because their KV was cached

    def run(self, loads: list, enter: float) -> float:
        """Put one micro-batch through the pipeline; returns when it leaves the last stage.
        ``loads``: (phase, cycles) of what it carries, cycles as ``StageTable.vector`` gives
        them (every stage's, the transfers', the stages' sum); a mixed micro-batch adds them."""
        phase, vec = loads[0]
        self.busy[phase] += vec[-1]
        for phase, more in loads[1:]:  # a chunk riding with decode tokens
            vec = vec + more
            self.busy[phase] += more[-1]
        done = advance(self.free, vec, enter, self.starts)
        if len(self.events) < self.max_events:
            label = "+".join(phase for phase, _ in loads)
            self.events.extend((s, self.starts[s], self.starts[s] + vec[s], label)
                               for s in range(len(self.free)))
        return done

    def decode(self, batch: list, loads: list, enter: float) -> float:
        """Run a micro-batch whose first load is the decode of ``batch`` (a prefill chunk may
        ride along), noting how long its tokens took beyond their own decode work: queueing
        for stage 0, waiting behind other micro-batches, and the chunk's work."""
        done = self.run(loads, enter)
        own = loads[0][1]
        alone = own[-1] + own[-2]  # its stages and the hops between them
        n = len(batch)
        waited = done - batch[0][2] if n == 1 else sum(done - since for _, _, since in batch)
        self.stall += waited - n * alone
        self.work += n * alone
        self.decoded += n
        self.in_flight += n
        return done

    def hold(self, tokens: int, now: float) -> None:
        """Take (or, negative, give back) KV cache, and note the occupancy."""
        self.kv_used += tokens
        self.kv_trace.append((now, self.kv_used))

    def keep(self, session: int, call: int, tokens: int) -> None:
        """Cache a finished call's KV for the session's next call (the newest entry last)."""
        old = self.cache.pop(session, None)
        self.cached += tokens - (old[1] if old else 0)
        self.cache[session] = (call, tokens)

    def make_room(self, tokens: int, spare: int | None = None) -> bool:
        """Whether ``tokens`` of KV fit once cached KV is given up, least recently used first
        (sparing session ``spare``'s, which the call being admitted reuses); gives it up if so."""
        cap = self.model.kv_capacity_tokens
        if self.kv_used + tokens > cap:
            return False
        mine = self.cache[spare][1] if spare in self.cache else 0
        over = self.kv_used + self.cached - mine + tokens - cap
        while over > 0:
            victim = next(v for v in self.cache if v != spare)
            freed = self.cache.pop(victim)[1]
            self.cached -= freed
            over -= freed
        return True

    def mean_kv(self, start: float, end: float) -> float:
        """Time-weighted KV tokens held between ``start`` and ``end``."""
        if not self.kv_trace:
            return 0.0
        times = [t for t, _ in self.kv_trace] + [end]
        held = sum(k * (t1 - t0) for (t0, k), t1 in zip(self.kv_trace, times[1:]))
        return held / max(end - start, 1.0)


@dataclass
class ServeResult:
    arrival: np.ndarray  # cycles
    first_token: np.ndarray
    finish: np.ndarray
    tokens: np.ndarray
    region: list
    clock_hz: float
    regions: dict = field(default_factory=dict)  # name -> utilization and KV occupancy
    timeline: dict = field(default_factory=dict)  # Chrome trace (when asked for)
    kv_traces: dict = field(default_factory=dict)  # region -> [(cycle, KV tokens held)]
    # Every token after a request's first: its request and the cycles since the token before.
    gap_request: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int32))
    gap_cycles: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def ttft_s(self) -> np.ndarray:
        return (self.first_token - self.arrival) / self.clock_hz

    def tpot_s(self) -> np.ndarray:
        gen = np.maximum(self.tokens - 1, 1)
        return (self.finish - self.first_token) / gen / self.clock_hz

    def itl_s(self, requests: np.ndarray | None = None) -> np.ndarray:
        """Inter-token latencies (every gap between a request's consecutive tokens), of the
        requests where the boolean mask ``requests`` is set (all by default)."""
        gaps = self.gap_cycles / self.clock_hz
        return gaps if requests is None else gaps[requests[self.gap_request]]


def serve(requests: Requests, regions: list[RegionModel], options: ServeOptions) -> ServeResult:
    n = len(requests)
    if not regions:
        raise UserError("no regions to serve on")
    if options.policy not in POLICIES:
        raise UserError(f"unknown policy {options.policy!r}: one of {', '.join(POLICIES)}")
    pipes = {r.name: _Pipeline(r, np.zeros(len(_table(r).cycles)),
                               np.zeros(len(_table(r).cycles)),
                               max_events=options.timeline_events) for r in regions}
    entry = [p for p in pipes.values() if p.model.role in ("mixed", "prefill")]
    decoders = [p for p in pipes.values() if p.model.role in ("mixed", "decode")]
    if not entry or not decoders:
        raise UserError("serving needs regions for both prefill and decode")
    need = requests.prompt_tokens + requests.output_tokens
    short = kv_shortfall(requests, regions)
    if short:
        raise UserError(short)
    arrival = np.full(n, np.nan)
    first = np.full(n, np.nan)
    finish = np.full(n, np.nan)
    made = [0] * n  # plain lists: the loop reads them for every token
    wanted = requests.output_tokens.tolist()
    need = need.tolist()
    where = [""] * n
    last = [0.0] * n  # when each request's latest token came out
    gap_request, gap_cycles = array("i"), array("d")
    session = requests.session.tolist()
    call = requests.call.tolist()
    # The prefix cache matters only when a session makes more than one call.
    caching = options.prefix_cache and len(set(session)) < n
    clock = options.clock_hz
    events: list = []
    seq = 0

    def schedule(t, kind, data):
        nonlocal seq
        heapq.heappush(events, (t, seq, kind, data))
        seq += 1

    # Sessions: a call arrives when the call before it has finished plus its think time.
    starts = {}
    for i in range(n):
        if not np.isnan(requests.arrival_s[i]):
            schedule(requests.arrival_s[i] * clock, "arrive", i)
        starts[(int(requests.session[i]), int(requests.call[i]))] = i

    def kick(p: _Pipeline, now: float):
        if p.busy_until <= now:
            schedule(max(now, p.free[0]), "dispatch", p.model.name)

    def release(p: _Pipeline, i: int, held: int, cached: int, now: float):
        """Request ``i`` leaves ``p``: its ``held`` KV tokens are freed, ``cached`` of them kept
        for the session's next call."""
        p.hold(-held, now)
        p.running -= 1
        if caching and cached:
            p.keep(session[i], call[i], cached)

    # Finished prompts wait in order for a decode region with room for their whole KV; the
    # prefill region keeps holding the prompt's KV until its transfer is done.
    handoffs: deque = deque()  # (request, prefill region)
    link_free: dict = {}  # (system, direction) -> when that link is next free
    cap = options.max_running
    head_blocked = [None]  # when the first waiting handoff began waiting for room

    def start_handoffs(now: float):
        while handoffs:
            i, src = handoffs[0]
            room = [q for q in decoders if q.kv_used + need[i] <= q.model.kv_capacity_tokens
                    and not (cap and q.running >= cap)]
            if not room:
                if head_blocked[0] is None:
                    head_blocked[0] = now
                return
            if head_blocked[0] is not None:
                pipes[src].kv_blocked += now - head_blocked[0]
                head_blocked[0] = None
            handoffs.popleft()
            q = min(room, key=lambda x: (x.kv_used, x.model.name))
            q.hold(need[i], now)
            q.running += 1
            sender, receiver = pipes[src].model.system, q.model.system
            if sender == receiver:  # across the wafer's fabric
                links, rate = [(sender, "fabric")], options.handoff_bytes_per_cycle
            else:  # out over one wafer's link and in over the other's
                links = [(sender, "send"), (receiver, "receive")]
                rate = options.offwafer_bytes_per_cycle
            nbytes = int(requests.prompt_tokens[i]) * options.kv_bytes_per_token
            done = max([now] + [link_free.get(link, 0.0) for link in links]) + nbytes / rate
            for link in links:
                link_free[link] = done
            schedule(done, "joined", (i, q.model.name, src))

    while events:
        now, _, kind, data = heapq.heappop(events)
        if kind == "decoded":  # the most frequent event first
            name, batch = data
            p = pipes[name]
            p.in_flight -= len(batch)
            for i, ctx, _ in batch:
                made[i] += 1
                gap_request.append(i)
                gap_cycles.append(now - last[i])
                last[i] = now
                if made[i] >= wanted[i]:
                    finish[i] = now
                    # A colocated region caches the whole context but the newest token, whose
                    # KV was never made; a decode region caches nothing.
                    release(p, i, need[i], need[i] - 1 if p.model.role == "mixed" else 0, now)
                    _next_call(i, now, requests, starts, clock, schedule)
                else:
                    p.ready.append((i, ctx + 1, now))
            if handoffs:
                start_handoffs(now)  # KV room may have been freed
            if p.busy_until <= now:  # kick(p, now), inline: it runs for every micro-batch
                schedule(max(now, p.free[0]), "dispatch", name)
        elif kind == "arrive":
            i = data
            arrival[i] = now
            # Where the session's previous call is cached; else the shortest queue, then the
            # pipeline free soonest.
            home = [q for q in entry if q.cache.get(session[i], (-1,))[0] == call[i] - 1] \
                if caching and call[i] > 0 else []
            p = home[0] if home else min(
                (q for q in entry if _holds(q.model, requests, i) <= q.model.kv_capacity_tokens),
                key=lambda q: (len(q.prefills), max(q.free[0], now), q.model.name))
            p.prefills.append(i)
            kick(p, now)
        elif kind == "dispatch":
            p = pipes[data]
            if now < p.free[0]:
                schedule(p.free[0], "dispatch", data)
                continue
            started = _dispatch(p, now, requests, options, schedule)
            if started and (p.prefills or p.ready):  # more to start once stage 0 frees
                p.busy_until = p.free[0]
                schedule(p.free[0], "dispatch", data)
            else:  # nothing waits: the next arrival or returning sequence kicks it
                p.busy_until = 0.0
        elif kind == "prefilled":
            i, name = data
            first[i] = now
            last[i] = now
            made[i] = 1
            p = pipes[name]
            prompt = int(requests.prompt_tokens[i])
            held = need[i] if p.model.role == "mixed" else prompt
            if made[i] >= wanted[i]:
                finish[i] = now
                release(p, i, held, prompt, now)
                _next_call(i, now, requests, starts, clock, schedule)
                kick(p, now)
                continue
            if p.model.role == "mixed":
                p.ready.append((i, int(requests.prompt_tokens[i]) + 1, now))
                where[i] = p.model.name
                kick(p, now)
            else:
                handoffs.append((i, name))
                start_handoffs(now)
        elif kind == "joined":
            i, name, src = data
            prompt = int(requests.prompt_tokens[i])
            release(pipes[src], i, prompt, prompt, now)  # the transfer is done
            kick(pipes[src], now)
            q = pipes[name]
            where[i] = name
            q.ready.append((i, int(requests.prompt_tokens[i]) + 1, now))
            kick(q, now)
    if np.isnan(finish).any():
        raise AssertionError("a request never finished")
    for p in pipes.values():
        if p.kv_used != 0:
            raise AssertionError(f"region {p.model.name} kept {p.kv_used} tokens of KV")
    span = float(np.nanmax(finish) - np.nanmin(arrival)) or 1.0
    stats = {}
    for name, p in pipes.items():
        stats[name] = {"role": p.model.role,
                       "stage_utilization": sum(p.busy.values()) / (len(p.free) * span),
                       "prefill_utilization": p.busy["prefill"] / (len(p.free) * span),
                       "decode_utilization": p.busy["decode"] / (len(p.free) * span),
                       "decode_tokens": p.decoded,
                       "decode_stall_s": p.stall / clock,
                       "decode_work_s": p.work / clock,
                       "kv_blocked_s": p.kv_blocked / clock,
                       "prefix_reused_tokens": p.reused,
                       "kv_capacity_tokens": p.model.kv_capacity_tokens,
                       "kv_peak_tokens": max((k for _, k in p.kv_trace), default=0),
                       "kv_mean_tokens": p.mean_kv(float(np.nanmin(arrival)),
                                                   float(np.nanmax(finish)))}
    timeline = _chrome_trace(pipes, clock) if options.timeline_events else {}
    return ServeResult(arrival, first, finish, np.array(made, dtype=np.int64), where, clock,
                       stats, timeline, {name: p.kv_trace for name, p in pipes.items()},
                       np.frombuffer(gap_request, dtype=np.int32).copy(),
                       np.frombuffer(gap_cycles, dtype=np.float64).copy())


def _chrome_trace(pipes: dict, clock: float) -> dict:
    """One process per region, one track per stage, an event per micro-batch (microseconds)."""
    us = 1e6 / clock
    events = []
    for pid, (name, p) in enumerate(pipes.items()):
        events.append({"name": "process_name", "ph": "M", "pid": pid,
                       "args": {"name": f"{name} ({p.model.role})"}})
        events += [{"name": "thread_name", "ph": "M", "pid": pid, "tid": s,
                    "args": {"name": f"stage {s}"}} for s in range(len(p.free))]
        for s, start, end, label in p.events:
            events.append({"name": label, "ph": "X", "pid": pid, "tid": s,
                           "ts": start * us, "dur": (end - start) * us})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def kv_shortfall(requests: Requests, regions: list) -> str | None:
    """Why some request could never be served on ``regions`` (anything with a ``role`` and
    ``kv_capacity_tokens``) for lack of KV room, or None."""
    total = int((requests.prompt_tokens + requests.output_tokens).max())
    prompt = int(requests.prompt_tokens.max())
    for role, longest, what, where in (("mixed", total, "a request", "any region"),
                                       ("prefill", prompt, "a prompt", "any prefill region"),
                                       ("decode", total, "a request", "any decode region")):
        room = [r.kv_capacity_tokens for r in regions if r.role == role]
        if room and longest > max(room):
            return (f"{what} needs {longest:,} tokens of KV cache, more than {where} holds "
                    f"({max(room):,})")
    return None


def _holds(m: RegionModel, requests: Requests, i: int) -> int:
    """KV tokens request ``i`` takes on entering ``m``: a colocated region keeps the sequence's
    whole KV, a prefill region only the prompt's, until the handoff."""
    prompt = int(requests.prompt_tokens[i])
    return prompt + int(requests.output_tokens[i]) if m.role == "mixed" else prompt


def _admit(p: _Pipeline, i: int, requests: Requests, options: ServeOptions,
           now: float) -> bool:
    """Admit request ``i``, at the head of ``p``'s queue, if its KV fits (giving up cached KV
    if need be) and the running cap allows, timing its wait otherwise. Its prompt starts after
    the prefix its session's previous call left in the cache, if still there."""
    m = p.model
    tokens = _holds(m, requests, i)
    session = int(requests.session[i])
    capped = options.max_running and m.role != "prefill" and p.running >= options.max_running
    if capped or not p.make_room(tokens, session):
        if p.blocked_since is None:
            p.blocked_since = now
        return False
    if p.blocked_since is not None:
        p.kv_blocked += now - p.blocked_since
        p.blocked_since = None
    reuse = 0
    cached = p.cache.pop(session, None)
    if cached is not None:
        p.cached -= cached[1]
        if cached[0] == requests.call[i] - 1:  # else stale: the session has moved on
            reuse = min(cached[1], int(requests.prompt_tokens[i]) - 1)
    p.reused += reuse
    p.progress[i] = reuse
    p.running += 1
    p.hold(tokens, now)
    return True


def _batch_size(p: _Pipeline, limit: int) -> int:
    """Sequences for the next decode micro-batch: the decoding sequences spread over as many
    micro-batches as the pipeline has stages, so that every stage has one to work on. (A
    decode step costs about the same per sequence whatever the batch, since the PEs compute
    from SRAM at its full rate even one token at a time; one big micro-batch would only leave
    the other stages idle, and once formed it stays together.)"""
    decoding = len(p.ready) + p.in_flight
    return max(1, min(limit, -(-decoding // len(p.free))))


def _mean_context(batch: list) -> float:
    return sum(c for _, c, _ in batch) / len(batch)


def _table(r: RegionModel) -> StageTable:
    return r.prefill if r.prefill is not None else r.decode


def _next_call(i, now, requests, starts, clock, schedule):
    nxt = starts.get((int(requests.session[i]), int(requests.call[i]) + 1))
    if nxt is not None:
        schedule(now + requests.think_s[nxt] * clock, "arrive", nxt)


def _dispatch(p: _Pipeline, now: float, requests: Requests, options: ServeOptions,
              schedule) -> bool:
    """Start the next micro-batch on ``p`` if there is one; prefill first."""
    m = p.model
    if options.policy == "chunked" and m.role == "mixed":
        return _dispatch_chunked(p, now, requests, options, schedule)
    if options.policy == "interleaved" and m.role == "mixed":
        return _dispatch_interleaved(p, now, requests, options, schedule)
    if p.prefills and m.prefill is not None:
        i = p.prefills[0]
        if _admit(p, i, requests, options, now):
            while p.prefills and p.prefills[0] == i:  # the whole prompt, tile after tile
                _prefill_tile(p, i, now, requests, options, schedule)
            return True
    return _dispatch_decode(p, now, options, schedule)


def _prefill_tile(p: _Pipeline, i: int, now: float, requests: Requests, options: ServeOptions,
                  schedule) -> None:
    """Send the next tile of prompt ``i`` (admitted already) into the pipeline; after the last
    one, the prompt leaves the queue and its first token is due when the tile comes out."""
    done_tokens = p.progress.get(i, 0)
    tile = min(options.prefill_tile, int(requests.prompt_tokens[i]) - done_tokens)
    done = p.run([("prefill", p.model.prefill.vector(tile, done_tokens))], now)
    p.progress[i] = done_tokens + tile
    if p.progress[i] == requests.prompt_tokens[i]:
        p.prefills.pop(0)
        del p.progress[i]
        schedule(done, "prefilled", (i, p.model.name))


def _dispatch_decode(p: _Pipeline, now: float, options: ServeOptions, schedule) -> bool:
    """A decode micro-batch of the ready sequences, if any."""
    m = p.model
    if not p.ready or m.decode is None:
        return False
    size = _batch_size(p, options.batch_limit)
    if size == 1:  # the common case under light load, kept cheap
        batch = [p.ready.pop(0)]
        context = batch[0][1]
    else:
        batch = p.ready[:size]
        del p.ready[:size]
        context = _mean_context(batch)
    done = p.decode(batch, [("decode", m.decode.vector(len(batch), context))], now)
    schedule(done, "decoded", (m.name, batch))
    p.decodes_since_prefill += 1
    return True


def _dispatch_interleaved(p: _Pipeline, now: float, requests: Requests, options: ServeOptions,
                          schedule) -> bool:
    """Prefill tiles and decode micro-batches take turns: when both wait, ``interleave`` decode
    micro-batches follow every prefill tile. A decode token then follows at most one tile
    through the stages (at that tile's pace, since micro-batches never overtake), instead of a
    whole prompt (prefill priority), and never carries prefill work itself (chunked)."""
    if p.ready and (p.decodes_since_prefill < options.interleave or not p.prefills):
        return _dispatch_decode(p, now, options, schedule)
    if p.prefills:
        i = p.prefills[0]
        if i in p.progress or _admit(p, i, requests, options, now):
            _prefill_tile(p, i, now, requests, options, schedule)
            p.decodes_since_prefill = 0
            return True
    return _dispatch_decode(p, now, options, schedule)


def _dispatch_chunked(p: _Pipeline, now: float, requests: Requests, options: ServeOptions,
                      schedule) -> bool:
    """Decode first, then the next prompt's tokens up to the token budget."""
    m = p.model
    batch = p.ready[:_batch_size(p, min(options.batch_limit, options.token_budget))]
    del p.ready[:len(batch)]
    parts = []
    if batch:
        parts.append(("decode", m.decode.vector(len(batch), _mean_context(batch))))
    room = options.token_budget - len(batch)
    finished_prompt = -1
    if p.prefills and room > 0:
        i = p.prefills[0]
        started = i in p.progress
        if started or _admit(p, i, requests, options, now):
            done_tokens = p.progress[i]
            chunk = min(room, int(requests.prompt_tokens[i]) - done_tokens)
            parts.append(("prefill", m.prefill.vector(chunk, done_tokens)))
            p.progress[i] = done_tokens + chunk
            if p.progress[i] == requests.prompt_tokens[i]:
                p.prefills.pop(0)
                del p.progress[i]
                finished_prompt = i
    if not parts:
        return False
    done = p.decode(batch, parts, now) if batch else p.run(parts, now)
    if batch:
        schedule(done, "decoded", (m.name, batch))
    if finished_prompt >= 0:
        schedule(done, "prefilled", (finished_prompt, m.name))
    return True
