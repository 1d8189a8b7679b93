"""Serving requests on pools, event by event (the execution model of the design notes).

A pool (``pools.py``; a compiled wafer region is one) is a pipeline of stages. A micro-batch (a
tile of a prompt, one new token for each of several sequences, or, chunked, both) enters stage
0 when it is free, holds each stage for that stage's time (from the pool's stage tables) and
moves on; micro-batches never overtake each other. A sequence's next token can enter only
after its previous one left the last stage. Which micro-batch a pool sends next is its
policy's choice (``policies.py``): colocated pools serve with the policy the options name, a
disaggregated split's pools first come first served.

Disaggregated, a finished prompt's KV cache moves to a decode pool with room for it. A handoff
inside a system crosses its fabric between the pools; between systems it leaves over the
sending system's link and arrives over the receiving system's, holding both (the links are
full duplex, so a system sends and receives at once); each link carries one sequence's KV
after another. A pool admits a sequence only when its KV fits (the whole sequence's in a
colocated or decode pool, the prompt's in a prefill pool) and, with a cap on running
sequences, when fewer than the cap hold KV there.

Agentic sessions send each call the whole context so far. With the prefix cache, a pool keeps
a finished call's KV (a colocated pool the call's prompt and output, a prefill pool the prompt
it handed off) until it needs the room, least recently used first; the session's next call
goes to that pool and computes only the tokens after the cached prefix. Decode pools keep
nothing: the next call's prefill runs elsewhere.

Each pool also counts its decode stall: the time its tokens spent beyond their own decode work
(waiting for stage 0, behind other micro-batches, or carrying a prefill chunk). It is what
colocation costs decode, and what disaggregation is meant to remove.

Two loops serve: the compiled one (``compiled_loop.py``, the default) and its plain-Python
twin (``plain_loop.py``); on the same inputs they give the same times.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, make_dataclass

import numpy as np

from wse_emu.checks import flag, one_of, positive, short_repr, whole
from wse_emu.errors import UserError
from wse_emu.runtime import compiled_loop as cl
from wse_emu.runtime.knobs import check_value, info
from wse_emu.runtime.plain_loop import RegionState, Simulation
from wse_emu.runtime.policies import POLICIES, SPLIT_POLICY, knob_fields
from wse_emu.runtime.workload import Requests

LOOPS = ("compiled", "plain")


@dataclass(kw_only=True)
class _ServeBase:
    """How requests are served. The hardware's numbers have no defaults: ``ServeOptions.of``
    takes them from the fabric and the model; the rest are the policy, the prefix cache, the
    timeline, and (generated from the policies' knob dataclasses) every knob."""

    clock_hz: float
    kv_bytes_per_token: int  # KV cache bytes per token (all layers)
    policy: str = "prefill-priority"  # colocated pools
    prefix_cache: bool = True  # reuse a session's KV still resident from its previous call
    timeline_events: int = 0  # stage events kept per pool for the timeline (0: none)

    def __post_init__(self):
        positive("clock_hz", self.clock_hz)
        whole("kv_bytes_per_token", self.kv_bytes_per_token, 0)
        whole("timeline_events", self.timeline_events, 0)
        one_of("policy", self.policy, POLICIES)
        flag("prefix_cache", self.prefix_cache)
        for f in knob_fields():
            check_value(f.name, info(f), getattr(self, f.name))

    @classmethod
    def of(cls, fabric, model, **settings) -> "ServeOptions":
        """Options for ``model`` (a ModelSpec) on ``fabric`` (a FabricSpec): its clock and
        the model's KV bytes per token; ``settings`` are the other fields, by name."""
        unknown = sorted(set(settings) - set(setting_names()))
        if unknown:
            raise UserError(f"unknown serving option `{unknown[0]}`: the options are "
                            f"{', '.join(setting_names())}")
        return cls(clock_hz=fabric.clock_hz, kv_bytes_per_token=model.kv_bytes_per_token(),
                   **settings)

    def policies(self) -> dict:
        """Each role's policy with its knobs."""
        split = SPLIT_POLICY.of(self)
        return {"mixed": POLICIES[self.policy].of(self), "prefill": split, "decode": split}


ServeOptions = make_dataclass(
    "ServeOptions",
    [(f.name, int, field(default=f.default, metadata=f.metadata)) for f in knob_fields()],
    bases=(_ServeBase,), kw_only=True, namespace={"__module__": __name__,
                                                  "__doc__": _ServeBase.__doc__})


def setting_names() -> tuple[str, ...]:
    """What ``ServeOptions.of`` (and the API's ``serve``) takes besides the hardware's."""
    return tuple(f.name for f in dataclasses.fields(ServeOptions)
                 if f.name not in ("clock_hz", "kv_bytes_per_token"))


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
    kv_traces: dict = field(default_factory=dict)  # pool -> [(cycle, KV tokens held)]
    # Every token after a request's first: its request and the cycles since the token before.
    gap_request: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int32))
    gap_cycles: np.ndarray = field(default_factory=lambda: np.zeros(0))
    requests: Requests | None = None  # what was served
    workload: str = ""  # its name

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

    def __repr__(self) -> str:
        done = int(np.isfinite(self.finish).sum())
        return (f"ServeResult({len(self.finish)} requests, {done} finished, "
                f"{int(self.tokens.sum()):,} output tokens, pools {', '.join(self.regions)})")


def check_micro_batches(pools: list, options) -> None:
    """Micro-batch sizes must lie within every pool's tables (their times are interpolated
    there, not guessed beyond)."""
    for p in pools:
        for name, table, applies in (
                ("batch_limit", p.decode, True),
                ("prefill_tile", p.prefill, True),
                ("token_budget", p.prefill, options.policy == "chunked" and p.role == "mixed")):
            if table is None or not applies:
                continue
            top = int(table.axis0[-1])
            value = getattr(options, name)
            if value > top:
                raise UserError(f"`{name}` must be between 1 and {top} (the range of pool "
                                f"{p.name}'s stage tables), got {value}")


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


def serve(requests: Requests, pools: list, options, loop: str = "compiled") -> ServeResult:
    """Serve ``requests`` on ``pools`` with ``options`` (a ServeOptions), on the compiled loop
    or its plain twin (``loop="plain"``)."""
    if not isinstance(options, ServeOptions):
        raise UserError(f"`options` must be a ServeOptions, got {short_repr(options)}")
    one_of("loop", loop, LOOPS)
    if not pools:
        raise UserError("no regions to serve on")
    roles = {p.role for p in pools}
    if not roles & {"mixed", "prefill"} or not roles & {"mixed", "decode"}:
        raise UserError("serving needs regions for both prefill and decode")
    check_micro_batches(pools, options)
    short = kv_shortfall(requests, pools)
    if short:
        raise UserError(short)
    caching = bool(options.prefix_cache) and len(np.unique(requests.session)) < len(requests)
    policies = options.policies()
    if loop == "plain":
        out = _serve_plain(requests, pools, options, policies, caching)
    else:
        out = _serve_compiled(requests, pools, options, policies, caching)
    return _result(requests, pools, options, *out)


def _serve_plain(requests, pools, options, policies, caching):
    regions = [RegionState(k, p, policies[p.role], options.timeline_events)
               for k, p in enumerate(pools)]
    sim = Simulation(requests, regions, options.clock_hz, options.kv_bytes_per_token, caching)
    sim.run()
    gaps = np.array(sim.gaps, dtype=np.float64).reshape(-1, 2)
    per_region = [(r.counters, r.kv.used, r.kv.trace, r.pipeline.events) for r in regions]
    stats = [{"busy_prefill": c.busy_prefill, "busy_decode": c.busy_decode,
              "decoded": c.decoded, "stall": c.stall, "work": c.work,
              "kv_blocked": c.kv_blocked, "reused": c.reused, "kv_used": used,
              "trace": trace, "events": events}
             for c, used, trace, events in per_region]
    return (sim.arrival, sim.first, sim.finish, np.array(sim.made, dtype=np.int64), sim.where,
            gaps[:, 0].astype(np.int32), gaps[:, 1].copy(), stats)


def _serve_compiled(requests, pools, options, policies, caching):
    st, arrivals = _state(requests, pools, options, policies, caching)
    dispatch = tuple(policies[role].compiled_dispatch() for role in ("mixed", "prefill",
                                                                      "decode"))
    knobs = tuple(policies[role].packed() for role in ("mixed", "prefill", "decode"))
    cl.run_loop(st, dispatch, knobs, *arrivals)
    names = [p.name for p in pools]
    traces = [[] for _ in pools]
    for r, t, k in zip(st.tr_reg[:st.counts[cl.TRACE]].tolist(),
                       st.tr_t[:st.counts[cl.TRACE]].tolist(),
                       st.tr_k[:st.counts[cl.TRACE]].tolist()):
        traces[r].append((t, k))
    stats = []
    for r in range(len(pools)):
        events = [(s, a, b, cl.LABELS[label]) for s, a, b, label in zip(
            st.ev_stage[r, :st.ev_n[r]].tolist(), st.ev_start[r, :st.ev_n[r]].tolist(),
            st.ev_end[r, :st.ev_n[r]].tolist(), st.ev_label[r, :st.ev_n[r]].tolist())]
        stats.append({"busy_prefill": float(st.busy_prefill[r]),
                      "busy_decode": float(st.busy_decode[r]),
                      "decoded": int(st.decoded[r]), "stall": float(st.stall[r]),
                      "work": float(st.work[r]), "kv_blocked": float(st.kv_blocked[r]),
                      "reused": int(st.reused[r]), "kv_used": int(st.kv_used[r]),
                      "trace": traces[r], "events": events})
    where = [names[w] if w >= 0 else "" for w in st.where.tolist()]
    g = st.counts[cl.GAPS]
    return (st.arrival, st.first, st.finish, st.made.copy(), where,
            st.gap_req[:g].astype(np.int32), st.gap_cyc[:g].copy(), stats)


def _state(requests: Requests, pools: list, options, policies: dict, caching: bool):
    """The compiled loop's state for these requests and pools, and the first calls' arrival
    stream (times, sequence numbers, requests) in order."""
    n, regions = len(requests), len(pools)
    sessions, session = np.unique(requests.session, return_inverse=True)
    stages = [p.stages for p in pools]
    tables, ptab, dtab = _pack_tables(pools, options)
    systems = sorted({p.system for p in pools})
    events = options.timeline_events
    shapes = {name: n for name in ("prompt", "output", "need", "session", "call", "think",
                                   "next_call", "arrival", "first", "finish", "made", "last",
                                   "where", "progress", "ctx", "since", "nxt", "pnext",
                                   "hnext", "hsrc")}
    shapes.update({name: regions for name in (
        "role", "cap", "system", "stages", "rank", "ptab", "dtab", "maxrun", "fabric_rate",
        "link_rate", "kv_used", "running", "cached", "reused", "decoded", "in_flight",
        "turns", "busy_prefill", "busy_decode", "stall", "work", "kv_blocked",
        "blocked_since", "busy_until", "pq_head", "pq_tail", "pq_len", "rq_head", "rq_tail",
        "rq_len", "fq_head", "fq_tail", "c_head", "c_tail", "ev_n", "lz_on", "lz_enter",
        "lz_d0", "lz_d1", "lz_df", "lz_dc", "lz_p0", "lz_p1", "lz_pf", "lz_pc")})
    shapes.update({"free": (regions, max(stages)), "starts": (regions, max(stages)),
                   "link_free": (len(systems), 3),
                   "gap_req": max(int((requests.output_tokens - 1).sum()), 1),
                   "gap_cyc": max(int((requests.output_tokens - 1).sum()), 1),
                   "tr_reg": 4 * n + 4, "tr_t": 4 * n + 4, "tr_k": 4 * n + 4,
                   "out_t": 2 * n + 16, "out_d": (2 * n + 16, 4), "counts": 6, "params": 6,
                   "fparams": 2})
    for name in ("c_call", "c_tok", "c_prev", "c_next"):
        shapes[name] = (regions, len(sessions) if caching else 1)
    for name in ("ev_stage", "ev_start", "ev_end", "ev_label"):
        shapes[name] = (regions, events + max(stages) if events else 1)
    for name, values in tables.items():
        shapes[name] = len(values)
    st = cl.new_state(shapes)
    for name, values in tables.items():
        getattr(st, name)[:] = values
    prompt, output = requests.prompt_tokens, requests.output_tokens
    st.prompt[:], st.output[:], st.need[:] = prompt, output, prompt + output
    st.session[:], st.call[:] = session, requests.call
    st.think[:] = requests.think_s * options.clock_hz
    calls = {(s, c): i for i, (s, c) in enumerate(zip(session.tolist(),
                                                       requests.call.tolist()))}
    st.next_call[:] = [calls.get((s, c + 1), -1) for s, c in zip(session.tolist(),
                                                                  requests.call.tolist())]
    for name in ("arrival", "first", "finish"):
        getattr(st, name)[:] = np.nan
    for name in ("where", "progress", "nxt", "pnext", "hnext", "hsrc", "c_head", "c_tail"):
        getattr(st, name)[:] = -1
    st.c_call[:] = -1
    st.c_prev[:] = -1
    st.c_next[:] = -1
    order = sorted(range(regions), key=lambda r: pools[r].name)
    for rank, r in enumerate(order):
        st.rank[r] = rank
    for r, p in enumerate(pools):
        st.role[r] = cl.ROLES[p.role]
        st.cap[r] = p.kv_capacity_tokens
        st.system[r] = systems.index(p.system)
        st.stages[r] = p.stages
        st.maxrun[r] = getattr(policies[p.role].knobs, "max_running", 0)
        st.fabric_rate[r] = p.fabric_bytes_per_cycle
        st.link_rate[r] = p.link_bytes_per_cycle
    st.ptab[:], st.dtab[:] = ptab, dtab
    st.turns[:] = 1 << 30
    st.blocked_since[:] = np.nan
    st.params[cl.CACHING] = int(caching)
    st.params[cl.MAX_EVENTS] = events
    st.params[cl.REGIONS] = regions
    st.params[cl.WIDTH] = st.free.shape[1]
    st.params[cl.SESSIONS] = st.c_call.shape[1]
    st.params[cl.EVENTS] = st.ev_stage.shape[1]
    st.fparams[cl.KV_BYTES] = options.kv_bytes_per_token
    st.fparams[cl.HEAD_BLOCKED] = np.nan
    first = np.flatnonzero(~np.isnan(requests.arrival_s))
    times = requests.arrival_s[first] * options.clock_hz
    order = np.argsort(times, kind="stable")  # by time, then by request (the order scheduled)
    return st, (np.ascontiguousarray(times[order]), order.astype(np.int64),
                first[order].astype(np.int64))


def _pack_tables(pools: list, options) -> tuple[dict, list, list]:
    """The distinct stage tables of ``pools``, packed end to end for the compiled loop, and
    each pool's prefill and decode table (index, or -1)."""
    tables: list = []
    index: dict = {}

    def add(table, amax: int) -> int:
        if table is None:
            return -1
        if id(table) not in index:
            index[id(table)] = len(tables)
            tables.append([table, amax])
        k = index[id(table)]
        tables[k][1] = max(tables[k][1], amax)
        return k

    tile = max(options.prefill_tile, options.token_budget)
    ptab = [add(p.prefill, tile) for p in pools]
    dtab = [add(p.decode, options.batch_limit) for p in pools]
    packed = {name: [] for name in ("tab_x", "tab_xo", "tab_xn", "tab_y", "tab_yo", "tab_yn",
                                    "tab_g", "tab_go", "tab_k", "tab_lo", "tab_so",
                                    "tab_amax")}
    lines = slots = 0
    for table, amax in tables:
        grid = table.grid()
        a, b, k = grid.shape
        for name, values in (("x", table.axis0), ("y", table.axis1)):
            packed[f"tab_{name}o"].append(len(packed[f"tab_{name}"]))
            packed[f"tab_{name}n"].append(len(values))
            packed[f"tab_{name}"].extend(float(v) for v in values)
        packed["tab_go"].append(len(packed["tab_g"]))
        packed["tab_g"].extend(grid.ravel().tolist())
        packed["tab_k"].append(k)
        packed["tab_lo"].append(lines)
        packed["tab_so"].append(slots)
        packed["tab_amax"].append(amax)
        lines += (amax + 2) * 2 * b * k  # a line and its steps per size, and a spare
        slots += amax + 1
    out = {name: np.asarray(values) for name, values in packed.items()}
    out["lines"] = np.zeros(max(lines, 1))
    out["line_ok"] = np.zeros(max(slots, 1), dtype=np.int64)
    return out, ptab, dtab


def _result(requests: Requests, pools: list, options, arrival, first, finish, made, where,
            gap_request, gap_cycles, stats) -> ServeResult:
    if np.isnan(finish).any():
        raise AssertionError("a request never finished")
    for p, s in zip(pools, stats):
        if s["kv_used"] != 0:
            raise AssertionError(f"region {p.name} kept {s['kv_used']} tokens of KV")
    clock = options.clock_hz
    start, end = float(np.nanmin(arrival)), float(np.nanmax(finish))
    span = (end - start) or 1.0
    regions = {}
    for p, s in zip(pools, stats):
        cycles = p.stages * span
        trace = s["trace"]
        regions[p.name] = {
            "role": p.role,
            "stage_utilization": (s["busy_prefill"] + s["busy_decode"]) / cycles,
            "prefill_utilization": s["busy_prefill"] / cycles,
            "decode_utilization": s["busy_decode"] / cycles,
            "decode_tokens": s["decoded"], "decode_stall_s": s["stall"] / clock,
            "decode_work_s": s["work"] / clock, "kv_blocked_s": s["kv_blocked"] / clock,
            "prefix_reused_tokens": s["reused"], "kv_capacity_tokens": p.kv_capacity_tokens,
            "kv_peak_tokens": max((k for _, k in trace), default=0),
            "kv_mean_tokens": _mean_kv(trace, start, end)}
    timeline = _chrome_trace(pools, stats, clock) if options.timeline_events else {}
    return ServeResult(arrival, first, finish, made, where, clock, regions, timeline,
                       {p.name: s["trace"] for p, s in zip(pools, stats)},
                       gap_request, gap_cycles, requests)


def _mean_kv(trace: list, start: float, end: float) -> float:
    """Time-weighted KV tokens held between ``start`` and ``end``."""
    if not trace:
        return 0.0
    times = [t for t, _ in trace] + [end]
    held = sum(k * (t1 - t0) for (t0, k), t1 in zip(trace, times[1:]))
    return held / max(end - start, 1.0)


def _chrome_trace(pools: list, stats: list, clock: float) -> dict:
    """One process per pool, one track per stage, an event per micro-batch (microseconds)."""
    us = 1e6 / clock
    events = []
    for pid, (p, s) in enumerate(zip(pools, stats)):
        events.append({"name": "process_name", "ph": "M", "pid": pid,
                       "args": {"name": f"{p.name} ({p.role})"}})
        events += [{"name": "thread_name", "ph": "M", "pid": pid, "tid": k,
                    "args": {"name": f"stage {k}"}} for k in range(p.stages)]
        for stage, begin, end, label in s["events"]:
            events.append({"name": label, "ph": "X", "pid": pid, "tid": stage,
                           "ts": begin * us, "dur": (end - begin) * us})
    return {"traceEvents": events, "displayTimeUnit": "ms"}
