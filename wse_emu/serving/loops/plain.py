"""The serving loop in plain Python: the compiled loop's twin, kept to check it.

Events are small classes, each with its own handler, ordered by (time, sequence number) on a
heap; a region's state is split by concern (its pipeline, its KV space and prefix cache, its
queues, its counters). A policy's ``dispatch`` (``policies.py``) starts micro-batches through
the primitives of ``Simulation`` (``admit``, ``send``, ``batch_size``, ...), which mirror the
compiled loop's one for one. On the same inputs both loops give the same times to the last
bit (``tests/serving/test_serve_twin.py``); ``serve(..., loop="plain")`` runs this one.
"""

from __future__ import annotations

import heapq
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from wse_emu.serving.caps import CAP_COUNTERS
from wse_emu.serving.loops.flowshop import advance
from wse_emu.serving.speculation import acceptance_runs, draft_stages_of, speculating


class Pipeline:
    """A region's stages: when each is next free, and when the last micro-batch started each.

    A micro-batch that enters an idle pipeline (every stage free by the time it gets there)
    leaves after its own time, the stages' sum and the hops': no stage has to wait, so that
    closed form is the recurrence's answer, up to rounding. Its stage-by-stage times are
    worked out only when a later micro-batch overlaps it (``lazy``). Most decode steps under
    light load are such lone micro-batches."""

    def __init__(self, stages: int, max_events: int):
        self.free = np.zeros(stages)
        self.starts = np.zeros(stages)
        self.lazy = None  # (enter, vector) of a lone micro-batch not yet worked out by stage
        self.dispatching = False  # the region's one Dispatch is in the heap
        self.events: list = []  # (stage, start, end, label) for the timeline
        self.max_events = max_events

    def run(self, vec: np.ndarray, enter: float, label: str) -> float:
        """Put one micro-batch through the stages; returns when it leaves the last one."""
        stages = len(self.free)
        if enter >= self.free[-1]:  # idle
            done = enter + (vec[-1] + vec[-2] if stages > 1 else vec[-1])
            self.free[0] = enter + vec[0]
            self.free[-1] = done
            self.lazy = (enter, vec)
            if len(self.events) < self.max_events:  # the picture only
                advance(np.zeros(stages), vec, enter, self.starts)
                self._note(vec, label)
            return done
        self.work_out()
        done = advance(self.free, vec, enter, self.starts)
        if len(self.events) < self.max_events:
            self._note(vec, label)
        return done

    def work_out(self) -> None:
        """The stage-by-stage times of the lone micro-batch, if one is pending."""
        if self.lazy is not None:
            enter, vec = self.lazy
            done = self.free[-1]
            self.free[:] = 0.0
            advance(self.free, vec, enter, self.starts)
            self.free[-1] = done
            self.lazy = None

    def _note(self, vec: np.ndarray, label: str) -> None:
        self.events.extend((s, self.starts[s], self.starts[s] + vec[s], label)
                           for s in range(len(self.free)))


class KVSpace:
    """A region's KV cache: what running sequences hold, and the prefix cache of finished
    calls kept for their sessions' next calls, or (a block trace's requests) of their prompts'
    prefix blocks, least recently used first given up."""

    def __init__(self, capacity: int, host_capacity: int = 0):
        self.capacity = capacity
        self.used = 0
        self.running = 0  # sequences holding KV here (admitted or handed over, not finished)
        self.cache: dict = {}  # session (or block) -> (call, KV tokens), oldest first
        self.cached = 0
        # The tier off the wafer (host memory): what the cache gave up, oldest first.
        self.host: dict = {}
        self.hosted = 0
        self.host_capacity = host_capacity
        self.trace: list = []  # (cycle, KV tokens held) after each change

    def hold(self, tokens: int, now: float) -> None:
        self.used += tokens
        self.trace.append((now, self.used))

    def keep(self, session: int, call: int, tokens: int) -> None:
        old = self.cache.pop(session, None)
        self.cached += tokens - (old[1] if old else 0)
        self.cache[session] = (call, tokens)
        self.unpark(session)  # an older copy in the host tier is superseded

    def park(self, key: int, entry: tuple) -> int:
        """An entry the cache gave up, kept in the host tier (its oldest given up for room):
        its tokens; dropped without a tier, or when larger than the tier: 0."""
        self.unpark(key)
        if entry[1] > self.host_capacity:
            return 0
        while self.hosted + entry[1] > self.host_capacity:
            self.unpark(next(iter(self.host)))
        self.host[key] = entry
        self.hosted += entry[1]
        return entry[1]

    def unpark(self, key: int) -> tuple | None:
        """The host tier's entry ``key``, given up (None if it holds none)."""
        entry = self.host.pop(key, None)
        if entry is not None:
            self.hosted -= entry[1]
        return entry

    def take_cached(self, session: int) -> tuple | None:
        """The session's cache entry, given up (None if there is none)."""
        entry = self.cache.pop(session, None)
        if entry is not None:
            self.cached -= entry[1]
        return entry

    def make_room(self, tokens: int, spare: tuple) -> int | None:
        """None if ``tokens`` do not fit even once cached KV is given up; else gives up what
        they need, least recently used first (sparing the entries ``spare`` names), and
        returns the tokens of it parked in the host tier."""
        if self.used + tokens > self.capacity:
            return None
        mine = sum(self.cache[s][1] for s in spare if s in self.cache)
        over = self.used + self.cached - mine + tokens - self.capacity
        parked = 0
        while over > 0:
            victim = next(v for v in self.cache if v not in spare)
            entry = self.cache.pop(victim)
            self.cached -= entry[1]
            over -= entry[1]
            parked += self.park(victim, entry)
        return parked


@dataclass
class Queues:
    """What waits on a region: prompts (and how far each admitted one has got), sequences
    ready for their next token, and sequences whose token is in the pipeline."""

    prompts: deque = field(default_factory=deque)
    progress: dict = field(default_factory=dict)
    ready: list = field(default_factory=list)  # (sequence, context, since when)
    flying: int = 0  # sequences whose next token is in the pipeline
    turns: int = 1 << 30  # decode micro-batches since the last prefill-only one


@dataclass
class Counters:
    busy_prefill: float = 0.0  # stage-cycles
    busy_decode: float = 0.0
    busy_draft: float = 0.0  # of busy_decode: in the draft's stages (speculating)
    stall: float = 0.0  # decode: token-cycles beyond the tokens' own decode work
    work: float = 0.0  # decode: token-cycles of the tokens' own decode work
    decoded: int = 0
    kv_blocked: float = 0.0  # cycles the prompt at the head of the queue waited for KV room
    blocked_since: float | None = None
    reused: int = 0  # prompt tokens not computed because their KV was cached
    restored: int = 0  # of those, tokens brought back from the host tier first
    parked: int = 0  # KV tokens sent to the host tier
    # What the caps decided (``serving.caps``): the most sequences a running-cap check found
    # holding KV, and the checks that found the cap reached; the most sequences a decode
    # micro-batch asked for, and the micro-batches the limit cut.
    running_peak: int = 0
    running_met: int = 0
    batch_peak: int = 0
    batch_met: int = 0


class RegionState:
    """One pool as the loop serves it."""

    def __init__(self, index: int, pool, policy, max_events: int, host_capacity: int = 0):
        self.index, self.pool, self.policy = index, pool, policy
        self.name, self.role = pool.name, pool.role
        self.pipeline = Pipeline(pool.stages, max_events)
        self.kv = KVSpace(pool.kv_capacity_tokens, host_capacity)
        self.queues = Queues()
        self.counters = Counters()
        self.max_running = policy.running_cap()
        self.serves_prefill = pool.prefill is not None
        self.serves_decode = pool.decode is not None
        # Speculative decoding: K drafted tokens checked per verify step, whose later tiles
        # follow the first through the stages at ``verify``'s times (None, 0: plain decode).
        self.verify, self.drafts = speculating(pool)
        self.draft_stages = draft_stages_of(pool)

    def capped(self) -> bool:
        """Whether its running cap stops another sequence now; what it found is noted."""
        c, n = self.counters, self.kv.running
        c.running_peak = max(c.running_peak, n)
        if self.max_running and n >= self.max_running:
            c.running_met += 1
            return True
        return False


class Event:
    """Something that happens at a time; ``handle`` does what follows from it."""

    __slots__ = ()

    def handle(self, sim: "Simulation", now: float) -> None:
        raise NotImplementedError


class Arrival(Event):
    __slots__ = ("i",)

    def __init__(self, i: int):
        self.i = i

    def handle(self, sim, now):
        i = self.i
        sim.arrival[i] = now
        # Its router's pick (``policies.ROUTERS``). Least busy (and prefix): where the
        # session's previous call is cached; prefix, for a block trace: where most of its
        # leading blocks are; round robin: the next region in turn; else the shortest queue,
        # then the pipeline free soonest.
        home = None
        if sim.router != "round-robin" and sim.caching and sim.call[i] > 0:
            home = next((q for q in sim.entry if sim.holds_session(q, i)), None)
        if home is None and sim.router == "prefix":
            home = sim.prefix_home(i, now)
        if home is None and sim.router == "round-robin":
            home = sim.in_turn(i)
        if home is None:
            home = min((q for q in sim.entry if sim.holds(q, i) <= q.kv.capacity),
                       key=lambda q: sim.busy(q, now))
        home.queues.prompts.append(i)
        sim.kick(home, now)


class Restored(Event):
    """An admitted request's KV, brought back from the host tier, has arrived: it rejoins
    its region's queue at the head, its prompt to go on after what came back."""

    __slots__ = ("i", "region")

    def __init__(self, i: int, region: RegionState):
        self.i, self.region = i, region

    def handle(self, sim, now):
        self.region.queues.prompts.appendleft(self.i)
        sim.kick(self.region, now)


class Dispatch(Event):
    __slots__ = ("region",)

    def __init__(self, region: RegionState):
        self.region = region

    def handle(self, sim, now):
        r = self.region
        r.pipeline.dispatching = False
        if now < r.pipeline.free[0]:
            r.pipeline.dispatching = True
            sim.schedule(r.pipeline.free[0], self)
            return
        went = r.policy.dispatch(sim, r, now)
        if went and (r.queues.prompts or r.queues.ready):  # more once stage 0 frees
            r.pipeline.dispatching = True
            sim.schedule(r.pipeline.free[0], Dispatch(r))
        # else nothing waits: the next arrival or returning sequence kicks it


class Decoded(Event):
    """A decode micro-batch left the last stage: each of its sequences has one more token, or,
    verified with speculation, one more and the drafted ones accepted before it."""

    __slots__ = ("region", "batch")

    def __init__(self, region: RegionState, batch: list):
        self.region, self.batch = region, batch

    def handle(self, sim, now):
        r = self.region
        q = r.queues
        q.flying -= len(self.batch)
        for i, ctx, _ in self.batch:
            tokens = 1
            if r.drafts:
                tokens = min(1 + min(sim.runs[sim.run_at[i]], r.drafts),
                             sim.output[i] - sim.made[i])
                sim.run_at[i] += 1
            for _ in range(tokens):  # the gap before the first; the others come with it
                sim.made[i] += 1
                sim.gaps.append((i, now - sim.last[i]))
                sim.last[i] = now
            r.counters.decoded += tokens
            if sim.made[i] >= sim.output[i]:
                sim.finish[i] = now
                # A colocated region caches the whole context but the newest token, whose KV
                # was never made; a decode region caches nothing.
                sim.release(r, i, sim.need[i], sim.need[i] - 1 if r.role == "mixed" else 0,
                            now)
                sim.next_call(i, now)
            else:
                q.ready.append((i, ctx + tokens, now))
        if sim.handoffs:
            sim.start_handoffs(now)  # KV room may have been freed
        sim.kick(r, now)


class Prefilled(Event):
    """A prompt's last tile left the last stage: its first token is out."""

    __slots__ = ("i", "region")

    def __init__(self, i: int, region: RegionState):
        self.i, self.region = i, region

    def handle(self, sim, now):
        i, r = self.i, self.region
        sim.first[i] = now
        sim.last[i] = now
        sim.made[i] = 1
        prompt = sim.prompt[i]
        if sim.made[i] >= sim.output[i]:
            sim.finish[i] = now
            sim.release(r, i, sim.holds(r, i), prompt, now)
            sim.next_call(i, now)
            sim.kick(r, now)
        elif r.role == "mixed":
            r.queues.ready.append((i, prompt + 1, now))
            sim.where[i] = r.name
            sim.kick(r, now)
        else:  # its KV moves to a decode region once one has room
            sim.handoffs.append((i, r))
            sim.start_handoffs(now)


class Joined(Event):
    """A prompt's KV cache arrived in its decode region."""

    __slots__ = ("i", "region", "source")

    def __init__(self, i: int, region: RegionState, source: RegionState):
        self.i, self.region, self.source = i, region, source

    def handle(self, sim, now):
        i = self.i
        prompt = sim.prompt[i]
        sim.release(self.source, i, prompt, prompt, now)  # the transfer is done
        sim.kick(self.source, now)
        sim.where[i] = self.region.name
        self.region.queues.ready.append((i, prompt + 1, now))
        sim.kick(self.region, now)


class Simulation:
    """Serving ``requests`` on ``regions`` (RegionStates) with ``handoff(src, dst)`` giving a
    transfer's links and bytes per cycle."""

    def __init__(self, requests, regions: list[RegionState], clock_hz: float,
                 kv_bytes_per_token: int, caching: bool, runs: tuple,
                 router: str = "least-busy", host_tier: bool = False,
                 host_overhead: float = 0.0):
        n = len(requests)
        # Speculative decoding's acceptance runs, and where each request's next one is.
        self.runs, self.run_at = runs[0].tolist(), runs[1][:-1].tolist()
        self.regions = regions
        self.entry = [q for q in regions if q.role in ("mixed", "prefill")]
        self.decoders = [q for q in regions if q.role in ("mixed", "decode")]
        self.prompt = requests.prompt_tokens.tolist()
        self.output = requests.output_tokens.tolist()
        self.need = [p + o for p, o in zip(self.prompt, self.output)]
        self.session = requests.session.tolist()
        self.call = requests.call.tolist()
        # A block trace's requests: each one's prefix blocks, what the cache keeps and shares.
        blocks = requests.blocks
        self.block_tokens = blocks.tokens if blocks is not None else 0
        self.block_ids = [blocks.of(i).tolist() for i in range(n)] if blocks is not None \
            else None
        self.think = (requests.think_s * clock_hz).tolist()
        self.arrival = np.full(n, np.nan)
        self.first = np.full(n, np.nan)
        self.finish = np.full(n, np.nan)
        self.made = [0] * n
        self.last = [0.0] * n
        self.where = [""] * n
        self.from_cache = [0] * n  # prompt tokens its region had cached
        self.from_host = [0] * n  # of those, tokens brought back from the host tier
        self.to_host = [0] * n  # KV tokens parked in the host tier to admit it
        self.gaps: list = []  # (request, cycles since its token before)
        self.kv_bytes_per_token = kv_bytes_per_token
        self.caching = caching
        self.router = router
        self.turn = 0  # the region a round-robin router tries next
        self.host_tier = host_tier  # whether KV given up is parked in host memory
        self.host_overhead = host_overhead  # cycles per transfer from it
        self.handoffs: deque = deque()  # (request, prefill region), in order
        self.link_free: dict = {}  # (system, "fabric" | "send" | "receive") -> when free
        self.head_blocked: float | None = None  # when the first waiting handoff began waiting
        self.events: list = []
        self.seq = 0
        calls = {(s, c): i for i, (s, c) in enumerate(zip(self.session, self.call))}
        self.next_of = [calls.get((s, c + 1), -1) for s, c in zip(self.session, self.call)]
        for i in range(n):
            if not np.isnan(requests.arrival_s[i]):
                self.schedule(requests.arrival_s[i] * clock_hz, Arrival(i))

    def schedule(self, t: float, event: Event) -> None:
        heapq.heappush(self.events, (t, self.seq, event))
        self.seq += 1

    def run(self) -> None:
        while self.events:
            now, _, event = heapq.heappop(self.events)
            event.handle(self, now)

    # --- the loop's own bookkeeping

    def kick(self, r: RegionState, now: float) -> None:
        """A dispatch of ``r`` once its stage 0 is free, unless one is in the heap already
        (copies would only wait again, and pile up under load)."""
        if not r.pipeline.dispatching:
            r.pipeline.dispatching = True
            self.schedule(max(now, r.pipeline.free[0]), Dispatch(r))

    def holds(self, r: RegionState, i: int) -> int:
        """KV tokens request ``i`` takes on entering ``r``: a colocated region keeps the
        sequence's whole KV, a prefill region only the prompt's, until the handoff."""
        return self.need[i] if r.role == "mixed" else self.prompt[i]

    def release(self, r: RegionState, i: int, held: int, cached: int, now: float) -> None:
        r.kv.hold(-held, now)
        r.kv.running -= 1
        if self.caching and cached:
            if self.block_ids is not None:
                self.keep_blocks(r, i)
            else:
                r.kv.keep(self.session[i], self.call[i], cached)

    def keep_blocks(self, r: RegionState, i: int) -> None:
        """Cache request ``i``'s prompt block by block, newest last: those already cached (by
        another request sharing them) stay where they are, its copy given up."""
        size, prompt = self.block_tokens, self.prompt[i]
        for j, b in enumerate(self.block_ids[i]):
            if b not in r.kv.cache:
                r.kv.keep(b, 0, min(size, prompt - j * size))

    def holds_session(self, q: RegionState, i: int) -> bool:
        """Whether region ``q`` keeps the previous call of request ``i``'s session, in its
        cache or its host tier."""
        entry = q.kv.cache.get(self.session[i]) or q.kv.host.get(self.session[i])
        return entry is not None and entry[0] == self.call[i] - 1

    def restore(self, r: RegionState, i: int, first: int, prefix: int,
                now: float) -> tuple | None:
        """With a host tier, as request ``i`` is admitted on ``r`` with ``prefix`` tokens of
        its prompt from the cache (a block trace's: its ``first`` blocks): the KV of its
        prompt ``r`` parked in host memory and that follows (the blocks after those cached; a
        session's previous call), taken out of the tier and brought back over its system's
        link in (shared with handoffs) when that is quicker than computing it again: (its
        tokens, when it is back), or None."""
        if not self.host_tier or not self.caching:
            return None
        kv = r.kv
        if self.block_ids is not None:
            run = []
            for b in self.block_ids[i][first:]:
                if b not in kv.host:
                    break
                run.append(b)
        else:
            entry = kv.host.get(self.session[i])
            run = [self.session[i]] if entry is not None and entry[0] == self.call[i] - 1 \
                else []
        if not run:
            return None
        tokens = sum(kv.host[key][1] for key in run)
        pool = r.pool
        back = self.host_overhead + tokens * self.kv_bytes_per_token / pool.link_bytes_per_cycle
        if back >= self.recompute(r, tokens, prefix):
            return None
        for key in run:
            kv.unpark(key)
        link = (pool.system, "receive")
        done = max(now, self.link_free.get(link, 0.0)) + back
        self.link_free[link] = done
        return tokens, done

    def park(self, r: RegionState, i: int, tokens: int, now: float) -> None:
        """What admitting request ``i`` on ``r`` gave up to the host tier (``tokens``) goes
        out over its system's link, in one transfer behind whatever uses the link already
        (the handoffs out). Written behind: the link drains KV faster than a prompt fills
        it, so the prompt does not wait."""
        r.counters.parked += tokens
        self.to_host[i] = tokens
        pool = r.pool
        out = self.host_overhead + tokens * self.kv_bytes_per_token / pool.link_bytes_per_cycle
        link = (pool.system, "send")
        self.link_free[link] = max(now, self.link_free.get(link, 0.0)) + out

    def recompute(self, r: RegionState, tokens: int, prefix: int) -> float:
        """Cycles ``r`` would take to compute ``tokens`` of a prompt after ``prefix`` cached
        ones again: tiles of its table's largest size through its slowest stage."""
        table = r.pool.prefill
        tile = min(tokens, int(table.axis0[-1]))
        slowest = float(table.vector(tile, prefix)[:-2].max())
        return slowest * -(-tokens // tile)

    def busy(self, q: RegionState, now: float) -> tuple:
        """How busy region ``q`` is, least first: its queue, when its pipeline frees, its
        name."""
        return len(q.queues.prompts), max(q.pipeline.free[0], now), q.name

    def prefix_home(self, i: int, now: float) -> RegionState | None:
        """Of the regions that take prompts and can hold block-trace request ``i``, the one
        caching most of its leading blocks (the least busy of those that tie); None when none
        caches any."""
        if not self.caching or self.block_ids is None:
            return None
        home, most = None, 0
        for q in self.entry:
            if self.holds(q, i) > q.kv.capacity:
                continue
            hits = len(self.cached_blocks(q, i))
            if hits > most or (hits == most and hits > 0
                               and self.busy(q, now) < self.busy(home, now)):
                home, most = q, hits
        return home

    def in_turn(self, i: int) -> RegionState | None:
        """The next region in turn that takes prompts and can hold request ``i``."""
        n = len(self.regions)
        for k in range(n):
            q = self.regions[(self.turn + k) % n]
            if q.role != "decode" and self.holds(q, i) <= q.kv.capacity:
                self.turn = q.index + 1
                return q
        return None

    def cached_blocks(self, r: RegionState, i: int) -> tuple:
        """The leading blocks of request ``i``'s prompt that ``r`` has cached: what it may
        reuse there."""
        out = []
        for b in self.block_ids[i]:
            if b not in r.kv.cache:
                break
            out.append(b)
        return tuple(out)

    def next_call(self, i: int, now: float) -> None:
        nxt = self.next_of[i]
        if nxt >= 0:
            self.schedule(now + self.think[nxt], Arrival(nxt))

    def start_handoffs(self, now: float) -> None:
        """Finished prompts, in order, move to the decode region with room for their whole KV
        that holds the least, over the links their transfer needs, one after another."""
        while self.handoffs:
            i, src = self.handoffs[0]
            room = [q for q in self.decoders if q.kv.used + self.need[i] <= q.kv.capacity
                    and not q.capped()]
            if not room:
                if self.head_blocked is None:
                    self.head_blocked = now
                return
            if self.head_blocked is not None:
                src.counters.kv_blocked += now - self.head_blocked
                self.head_blocked = None
            self.handoffs.popleft()
            q = min(room, key=lambda x: (x.kv.used, x.name))
            q.kv.hold(self.need[i], now)
            q.kv.running += 1
            sender, receiver = src.pool.system, q.pool.system
            latency = 0.0
            if sender == receiver:  # across the wafer's fabric
                links, rate = [(sender, "fabric")], src.pool.fabric_bytes_per_cycle
            else:  # out over one system's link and in over the other's
                links = [(sender, "send"), (receiver, "receive")]
                rate = min(src.pool.link_bytes_per_cycle, q.pool.link_bytes_per_cycle)
                # The network's latency delays the arrival; the links are free again as the
                # last byte leaves.
                latency = max(src.pool.link_latency_cycles, q.pool.link_latency_cycles)
            nbytes = self.prompt[i] * self.kv_bytes_per_token
            sent = max([now] + [self.link_free.get(link, 0.0) for link in links]) \
                + nbytes / rate
            for link in links:
                self.link_free[link] = sent
            self.schedule(sent + latency, Joined(i, q, src))

    # --- what a policy's dispatch is built from (as in compiled_loop)

    def next_prompt(self, r: RegionState) -> int:
        return r.queues.prompts[0] if r.queues.prompts else -1

    def queued(self, r: RegionState, k: int) -> int:
        """The ``k``-th prompt of ``r``'s queue (0: its head), or -1."""
        return r.queues.prompts[k] if k < len(r.queues.prompts) else -1

    def started(self, r: RegionState, i: int) -> bool:
        return i in r.queues.progress

    def remaining(self, r: RegionState, i: int) -> int:
        return self.prompt[i] - r.queues.progress[i]

    def batch_size(self, r: RegionState, limit: int) -> int:
        """Sequences for the next decode micro-batch: the decoding sequences spread over as
        many micro-batches as the pipeline has stages (so that every stage has one to work
        on), at most ``limit``. What it asks for of the ready sequences, and whether
        ``limit`` cut that, is noted (``serving.caps``)."""
        decoding = len(r.queues.ready) + r.queues.flying
        want = max(1, -(-decoding // len(r.pipeline.free)))
        asked = min(want, len(r.queues.ready))  # the callers take no more than are ready
        c = r.counters
        c.batch_peak = max(c.batch_peak, asked)
        c.batch_met += asked > limit
        return min(limit, want)

    def admit(self, r: RegionState, i: int, now: float) -> bool:
        """Admit request ``i``, at the head of ``r``'s queue, if its KV fits (giving up
        cached KV if need be) and the running cap allows, timing its wait otherwise. Its
        prompt starts after the prefix its session's previous call left in the cache (a block
        trace's request: after its leading blocks the cache holds)."""
        tokens = self.holds(r, i)
        session = self.session[i]
        c = r.counters
        capped = r.role != "prefill" and r.capped()
        hits = self.cached_blocks(r, i) if self.block_ids is not None else ()
        parked = None if capped else r.kv.make_room(
            tokens, hits if self.block_ids is not None else (session,))
        if parked is None:
            if c.blocked_since is None:
                c.blocked_since = now
            return False
        if parked:
            self.park(r, i, parked, now)
        if c.blocked_since is not None:
            c.kv_blocked += now - c.blocked_since
            c.blocked_since = None
        cached = 0
        if self.block_ids is not None:  # its leading cached blocks, taken over
            cached = sum(r.kv.take_cached(b)[1] for b in hits)
        else:
            entry = r.kv.take_cached(session)
            if entry is not None and entry[0] == self.call[i] - 1:  # else stale
                cached = entry[1]
        restoring = self.restore(r, i, len(hits), cached, now)
        reuse = min(cached + (restoring[0] if restoring else 0), self.prompt[i] - 1)
        c.reused += reuse
        self.from_cache[i] = reuse
        r.queues.progress[i] = reuse
        r.kv.running += 1
        r.kv.hold(tokens, now)
        if restoring is None:
            return True
        # Its prompt goes on once the KV is back: out of the queue until then.
        # Of the tokens reused, those the tier brought back (a prompt's last token is computed
        # whatever was cached).
        host = min(restoring[0], reuse - min(cached, reuse))
        c.restored += host
        self.from_host[i] = host
        r.queues.prompts.remove(i)
        self.schedule(restoring[1], Restored(i, r))
        return False

    def send(self, r: RegionState, now: float, sequences: int, i: int, tokens: int) -> None:
        """Start one micro-batch on ``r``: a decode step of the next ``sequences`` ready
        sequences (0: none) and the next ``tokens`` tokens of the admitted prompts from ``i``,
        the head of its queue, on (-1: none): the rest of each but the last, which may stop
        partway."""
        q, c = r.queues, r.counters
        batch = []
        if sequences:
            if sequences == 1:
                batch = [q.ready.pop(0)]
                context = batch[0][1]
            else:
                batch = q.ready[:sequences]
                del q.ready[:sequences]
                context = sum(ctx for _, ctx, _ in batch) / sequences
        # Riding in a chunk's step (``Pool.riding``), the decode's share is its own table's
        # and its sequences' tokens join the chunk's.
        merged = sequences and i >= 0 and r.pool.riding is not None
        if sequences:
            own = (r.pool.riding if merged else r.pool.decode).vector(sequences, context)
        if i >= 0:
            # Several prompts' tokens are read as one chunk at their mean prefix,
            # token-weighted.
            left, k, weighted = tokens, 0, 0.0
            while left > 0:
                j = q.prompts[k]
                take = min(left, self.prompt[j] - q.progress[j])
                weighted += take * q.progress[j]
                left -= take
                k += 1
            chunk = r.pool.prefill.vector(tokens + (sequences if merged else 0),
                                          weighted / tokens)
        for s in range(r.draft_stages if sequences else 0):  # one by one, as its twin adds
            c.busy_draft += float(own[s])
        if sequences and i >= 0:
            c.busy_decode += own[-1]
            c.busy_prefill += chunk[-1]
            done = r.pipeline.run(own + chunk, now, "decode+prefill")
        elif sequences:
            c.busy_decode += own[-1]
            done = r.pipeline.run(own, now, "decode")
            q.turns += 1
        else:
            c.busy_prefill += chunk[-1]
            done = r.pipeline.run(chunk, now, "prefill")
            q.turns = 0
        verified = done  # when the decode's tokens are out
        if sequences and r.drafts:
            # A verify step: the later tiles follow the first, one per drafted token.
            period = r.verify.vector(sequences, context)
            for _ in range(r.drafts):
                c.busy_decode += period[-1]
                verified = r.pipeline.run(period, now, "verify")
        if sequences:
            alone = own[-1] + own[-2]  # its stages and the hops between them
            if r.drafts:  # and its later tiles, at the pace of its slowest stage
                alone += r.drafts * float(period[:-2].max())
            waited = verified - batch[0][2] if sequences == 1 else \
                sum(verified - since for _, _, since in batch)
            c.stall += waited - sequences * alone
            c.work += sequences * alone
            q.flying += sequences
            self.schedule(verified, Decoded(r, batch))
        left = tokens if i >= 0 else 0
        while left > 0:
            j = q.prompts[0]
            take = min(left, self.prompt[j] - q.progress[j])
            q.progress[j] += take
            left -= take
            if q.progress[j] == self.prompt[j]:  # the whole prompt is in
                q.prompts.popleft()
                del q.progress[j]
                self.schedule(done, Prefilled(j, r))

    def send_decode(self, r: RegionState, now: float, limit: int) -> bool:
        """A decode micro-batch of the ready sequences, at most ``limit``, if any."""
        if not r.queues.ready or not r.serves_decode:
            return False
        self.send(r, now, min(self.batch_size(r, limit), len(r.queues.ready)), -1, 0)
        return True


def serve_plain(requests, pools: list, options, policies: dict, caching: bool) -> tuple:
    """Serve on this loop: the fields of ``serve.LoopOutput``. ``policies``: each role's
    policy; ``caching``: whether the prefix cache is kept."""
    tier = options.kv_tier == "host"
    regions = [RegionState(k, p, policies[p.role], options.timeline_events,
                           options.host_tokens() if tier else 0)
               for k, p in enumerate(pools)]
    sim = Simulation(requests, regions, options.clock_hz, options.kv_bytes_per_token, caching,
                     acceptance_runs(requests, options), options.router, tier,
                     options.host_transfer_overhead_s * options.clock_hz)
    began = time.perf_counter()
    sim.run()
    loop_s = time.perf_counter() - began
    gaps = np.array(sim.gaps, dtype=np.float64).reshape(-1, 2)
    per_region = [(r.counters, r.kv.used, r.kv.trace, r.pipeline.events) for r in regions]
    stats = [{"busy_prefill": c.busy_prefill, "busy_decode": c.busy_decode,
              "busy_draft": c.busy_draft,
              "decoded": c.decoded, "stall": c.stall, "work": c.work,
              "kv_blocked": c.kv_blocked, "reused": c.reused, "restored": c.restored,
              "parked": c.parked,
              "kv_used": used, **{name: getattr(c, name) for name in CAP_COUNTERS},
              "trace": np.array(trace, dtype=np.float64).reshape(-1, 2), "events": events}
             for c, used, trace, events in per_region]
    return (sim.arrival, sim.first, sim.finish, np.array(sim.made, dtype=np.int64), sim.where,
            np.array(sim.from_cache, dtype=np.int64), np.array(sim.from_host, dtype=np.int64),
            np.array(sim.to_host, dtype=np.int64), gaps[:, 0].astype(np.int32),
            gaps[:, 1].copy(), stats, loop_s)
