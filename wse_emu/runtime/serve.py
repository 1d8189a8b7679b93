"""Serving requests on regions, event by event (the execution model of the design notes).

A region is a pipeline of stages. A micro-batch (a prefill tile of one prompt, or one new token
for each of up to ``batch_limit`` sequences) enters stage 0 when it is free, holds each stage
for that stage's time (from the region's stage-time tables) and moves on; micro-batches never
overtake each other. A sequence's next token can enter only after its previous one left the
last stage. Colocated regions serve both phases with prefill priority: a waiting prompt goes
before any decode micro-batch. With chunked prefill instead, every micro-batch takes the ready
decode sequences first and fills the rest of a token budget with the next prompt's tokens; its
stage times are the decode's and the prefill chunk's, added. Disaggregated, prefill regions
serve prompts first come first served, and a finished prompt's KV cache moves to a decode
region with room for it (the handoff takes the KV's bytes over the link between them); decode
regions run decode micro-batches. A region admits a sequence only when its whole KV (prompt
and output) fits.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import numpy as np

from wse_emu.errors import UserError
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
    max_tile_tokens: int = 4096


@dataclass
class ServeOptions:
    batch_limit: int = 64
    policy: str = "prefill-priority"  # colocated regions: or "chunked"
    token_budget: int = 512  # chunked prefill: tokens per micro-batch
    clock_hz: float = 1.1e9
    handoff_bytes_per_cycle: float = 136.0  # the link between prefill and decode regions
    kv_bytes_per_token: int = 0
    timeline_events: int = 0  # stage events kept per region for the timeline (0: none)


@dataclass
class _Pipeline:
    model: RegionModel
    free: np.ndarray  # cycle each stage next becomes free
    kv_used: int = 0
    prefills: list = field(default_factory=list)  # request ids waiting, in order
    progress: dict = field(default_factory=dict)  # chunked prefill: prompt tokens done
    busy: float = 0.0  # stage-cycles held by micro-batches
    kv_trace: list = field(default_factory=list)  # (cycle, KV tokens held) after each change
    events: list = field(default_factory=list)  # (stage, start, end, label) for the timeline
    max_events: int = 0
    ready: list = field(default_factory=list)  # sequences ready for their next token
    busy_until: float = 0.0

    def run(self, parts: list, enter: float) -> float:
        """Put one micro-batch through the pipeline; returns when it leaves the last stage.
        ``parts``: (table, a, b) of what it carries; a mixed micro-batch adds their times.

        Stage s starts at max(arrival at s, free[s]); with D[s] the stage times and hops
        before s, start[s] - D[s] = max(enter, max over k <= s of free[k] - D[k])."""
        table, a, b = parts[0]
        times, hop_total = table.at(a, b)
        for table, a, b in parts[1:]:
            more, between = table.at(a, b)
            times = times + more
            hop_total += between
        hop = hop_total / max(len(times) - 1, 1)
        before = np.concatenate([[0.0], np.cumsum(times[:-1] + hop)])
        start = np.maximum(np.maximum.accumulate(self.free - before), enter) + before
        self.free = start + times
        self.busy += float(times.sum())
        if len(self.events) < self.max_events:
            label = "+".join(t.phase for t, _, _ in parts)
            self.events.extend((s, start[s], self.free[s], label) for s in range(len(times)))
        return float(self.free[-1])

    def hold(self, tokens: int, now: float) -> None:
        """Take (or, negative, give back) KV cache, and note the occupancy."""
        self.kv_used += tokens
        self.kv_trace.append((now, self.kv_used))

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

    def ttft_s(self) -> np.ndarray:
        return (self.first_token - self.arrival) / self.clock_hz

    def tpot_s(self) -> np.ndarray:
        gen = np.maximum(self.tokens - 1, 1)
        return (self.finish - self.first_token) / gen / self.clock_hz


def serve(requests: Requests, regions: list[RegionModel], options: ServeOptions) -> ServeResult:
    n = len(requests)
    if not regions:
        raise UserError("no regions to serve on")
    pipes = {r.name: _Pipeline(r, np.zeros(len(_table(r).cycles)),
                               max_events=options.timeline_events) for r in regions}
    entry = [p for p in pipes.values() if p.model.role in ("mixed", "prefill")]
    decoders = [p for p in pipes.values() if p.model.role in ("mixed", "decode")]
    if not entry or not decoders:
        raise UserError("serving needs regions for both prefill and decode")
    need = requests.prompt_tokens + requests.output_tokens
    if need.max() > max(p.model.kv_capacity_tokens for p in decoders):
        raise UserError(f"a request needs {int(need.max()):,} tokens of KV cache, more than any "
                        "region holds")
    arrival = np.full(n, np.nan)
    first = np.full(n, np.nan)
    finish = np.full(n, np.nan)
    made = np.zeros(n, dtype=np.int64)
    where = [""] * n
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

    while events:
        now, _, kind, data = heapq.heappop(events)
        if kind == "arrive":
            i = data
            arrival[i] = now
            p = min(entry, key=lambda q: (len(q.prefills), q.model.name))
            p.prefills.append(i)
            kick(p, now)
        elif kind == "dispatch":
            p = pipes[data]
            if now < p.free[0]:
                schedule(p.free[0], "dispatch", data)
                continue
            started = _dispatch(p, now, requests, options, schedule)
            if started:
                p.busy_until = p.free[0]
                schedule(p.free[0], "dispatch", data)
            else:
                p.busy_until = 0.0
        elif kind == "prefilled":
            i, name = data
            first[i] = now
            made[i] = 1
            p = pipes[name]
            held = int(need[i]) if p.model.role == "mixed" else int(requests.prompt_tokens[i])
            if made[i] >= requests.output_tokens[i]:
                finish[i] = now
                p.hold(-held, now)
                _next_call(i, now, requests, starts, clock, schedule)
                kick(p, now)
                continue
            if p.model.role == "mixed":
                p.ready.append((i, int(requests.prompt_tokens[i]) + 1))
                where[i] = p.model.name
                kick(p, now)
            else:
                p.hold(-held, now)
                kick(p, now)
                schedule(now, "handoff", i)
        elif kind == "handoff":
            i = data
            room = [q for q in decoders if q.kv_used + need[i] <= q.model.kv_capacity_tokens]
            if not room:
                schedule(now + clock * 1e-3, "handoff", i)  # wait for room, look again in 1 ms
                continue
            q = min(room, key=lambda x: (x.kv_used, x.model.name))
            q.hold(int(need[i]), now)
            nbytes = int(requests.prompt_tokens[i]) * options.kv_bytes_per_token
            schedule(now + nbytes / options.handoff_bytes_per_cycle, "joined", (i, q.model.name))
        elif kind == "joined":
            i, name = data
            q = pipes[name]
            where[i] = name
            q.ready.append((i, int(requests.prompt_tokens[i]) + 1))
            kick(q, now)
        elif kind == "decoded":
            name, batch = data
            p = pipes[name]
            for i, ctx in batch:
                made[i] += 1
                if made[i] >= requests.output_tokens[i]:
                    finish[i] = now
                    p.hold(-int(need[i]), now)
                    _next_call(i, now, requests, starts, clock, schedule)
                else:
                    p.ready.append((i, ctx + 1))
            kick(p, now)
    if np.isnan(finish).any():
        raise AssertionError("a request never finished")
    for p in pipes.values():
        if p.kv_used != 0:
            raise AssertionError(f"region {p.model.name} kept {p.kv_used} tokens of KV")
    span = float(np.nanmax(finish) - np.nanmin(arrival)) or 1.0
    stats = {}
    for name, p in pipes.items():
        stats[name] = {"role": p.model.role,
                       "stage_utilization": p.busy / (len(p.free) * span),
                       "kv_capacity_tokens": p.model.kv_capacity_tokens,
                       "kv_peak_tokens": max((k for _, k in p.kv_trace), default=0),
                       "kv_mean_tokens": p.mean_kv(float(np.nanmin(arrival)),
                                                   float(np.nanmax(finish)))}
    timeline = _chrome_trace(pipes, clock) if options.timeline_events else {}
    return ServeResult(arrival, first, finish, made, where, clock, stats, timeline)


def _chrome_trace(pipes: dict, clock: float) -> dict:
    """One process per region, one track per stage, an event per micro-batch (microseconds)."""
    us = 1e6 / clock
    events = []
    for pid, (name, p) in enumerate(pipes.items()):
        events.append({"name": "process_name", "ph": "M", "pid": pid,
                       "args": {"name": f"{name} ({p.model.role})"}})
        for s, start, end, label in p.events:
            events.append({"name": label, "ph": "X", "pid": pid, "tid": s,
                           "ts": start * us, "dur": (end - start) * us})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


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
    if p.prefills and m.prefill is not None:
        i = p.prefills[0]
        need = int(requests.prompt_tokens[i] + requests.output_tokens[i])
        # A colocated region keeps the sequence's whole KV; a prefill region only the prompt's,
        # until the handoff.
        holds = need if m.role == "mixed" else int(requests.prompt_tokens[i])
        if p.kv_used + holds <= m.kv_capacity_tokens:
            p.prefills.pop(0)
            p.hold(holds, now)
            tokens = int(requests.prompt_tokens[i])
            done, prefix = now, 0
            while prefix < tokens:  # long prompts go through as consecutive tiles
                tile = min(m.max_tile_tokens, tokens - prefix)
                done = p.run([(m.prefill, tile, prefix)], now)
                prefix += tile
            schedule(done, "prefilled", (i, m.name))
            return True
    if p.ready and m.decode is not None:
        batch = p.ready[:options.batch_limit]
        del p.ready[:options.batch_limit]
        context = sum(c for _, c in batch) / len(batch)
        done = p.run([(m.decode, len(batch), context)], now)
        schedule(done, "decoded", (m.name, batch))
        return True
    return False


def _dispatch_chunked(p: _Pipeline, now: float, requests: Requests, options: ServeOptions,
                      schedule) -> bool:
    """Decode first, then the next prompt's tokens up to the token budget."""
    m = p.model
    batch = p.ready[:min(options.batch_limit, options.token_budget)]
    del p.ready[:len(batch)]
    parts = []
    if batch:
        parts.append((m.decode, len(batch), sum(c for _, c in batch) / len(batch)))
    room = options.token_budget - len(batch)
    finished_prompt = -1
    if p.prefills and room > 0:
        i = p.prefills[0]
        need = int(requests.prompt_tokens[i] + requests.output_tokens[i])
        started = i in p.progress
        if started or p.kv_used + need <= m.kv_capacity_tokens:
            if not started:
                p.hold(need, now)
                p.progress[i] = 0
            done_tokens = p.progress[i]
            chunk = min(room, int(requests.prompt_tokens[i]) - done_tokens, m.max_tile_tokens)
            parts.append((m.prefill, chunk, done_tokens))
            p.progress[i] = done_tokens + chunk
            if p.progress[i] == requests.prompt_tokens[i]:
                p.prefills.pop(0)
                del p.progress[i]
                finished_prompt = i
    if not parts:
        return False
    done = p.run(parts, now)
    if batch:
        schedule(done, "decoded", (m.name, batch))
    if finished_prompt >= 0:
        schedule(done, "prefilled", (finished_prompt, m.name))
    return True
