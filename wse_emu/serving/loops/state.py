"""The compiled loop's arrays, made from the requests, the pools and the options, and what the
loop leaves in them, read back: the requests as columns, each pool's queues and counters,
the pools' stage tables packed end to end (each distinct table once), the first calls'
arrivals sorted into the stream the loop merges with its heap."""

from __future__ import annotations

import time

import numpy as np

from wse_emu.serving.loops import compiled as cl
from wse_emu.serving.workload import Requests


def serve_compiled(requests: Requests, pools: list, options, policies: dict,
                   caching: bool) -> tuple:
    """Serve on the compiled loop: the fields of ``serve.LoopOutput``. ``policies``: each
    role's policy; ``caching``: whether the prefix cache is kept."""
    dispatch = tuple(policies[role].compiled_dispatch() for role in ("mixed", "prefill",
                                                                      "decode"))
    knobs = tuple(policies[role].packed() for role in ("mixed", "prefill", "decode"))
    heap = heap_room(len(requests))
    while True:
        st, arrivals = _state(requests, pools, options, policies, caching, heap)
        began = time.perf_counter()
        handled = cl.run_loop(st, dispatch, knobs, *arrivals)
        loop_s = time.perf_counter() - began
        if handled >= 0:
            break
        heap *= 2
    names = [p.name for p in pools]
    held = st.counts[cl.TRACE]
    trace = np.column_stack((st.tr_t[:held], st.tr_k[:held].astype(np.float64)))
    owner = st.tr_reg[:held]
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
                      "trace": trace[owner == r] if len(pools) > 1 else trace,
                      "events": events})
    where = [names[w] if w >= 0 else "" for w in st.where.tolist()]
    g = st.counts[cl.GAPS]
    return (st.arrival, st.first, st.finish, st.made.copy(), where,
            st.gap_req[:g].astype(np.int32), st.gap_cyc[:g].copy(), stats, loop_s)


def heap_room(requests: int) -> int:
    """Events the heap has room for at first. Each request has at most one event due at a
    time, and each region its dispatches: twice the requests is more than enough in practice;
    should it not be, the loop says so and runs again, on a fresh state with twice the room."""
    return 2 * requests + 64


def _state(requests: Requests, pools: list, options, policies: dict, caching: bool,
           heap: int):
    """The compiled loop's state for these requests and pools, with room for ``heap`` events
    in its heap, and the first calls' arrival stream (times, sequence numbers, requests) in
    order."""
    n, regions = len(requests), len(pools)
    sessions, session = np.unique(requests.session, return_inverse=True)
    stages = [p.stages for p in pools]
    tables, ptab, dtab, rtab = _pack_tables(pools, options)
    systems = sorted({p.system for p in pools})
    events = options.timeline_events
    shapes = {name: n for name in ("prompt", "output", "need", "session", "call", "think",
                                   "next_call", "arrival", "first", "finish", "made", "last",
                                   "where", "progress", "ctx", "since", "nxt", "pnext",
                                   "hnext", "hsrc")}
    shapes.update({name: regions for name in (
        "role", "cap", "system", "stages", "rank", "ptab", "dtab", "rtab", "maxrun", "fabric_rate",
        "link_rate", "link_lat", "kv_used", "running", "cached", "reused", "decoded", "in_flight",
        "turns", "busy_prefill", "busy_decode", "stall", "work", "kv_blocked",
        "blocked_since", "dispatching", "pq_head", "pq_tail", "pq_len", "rq_head", "rq_tail",
        "rq_len", "fq_head", "fq_tail", "c_head", "c_tail", "ev_n", "lz_on", "lz_enter",
        "lz_d0", "lz_d1", "lz_df", "lz_dc", "lz_p0", "lz_p1", "lz_pf", "lz_pc")})
    shapes.update({"free": (regions, max(stages)), "starts": (regions, max(stages)),
                   "times": max(stages),
                   "link_free": (len(systems), 3),
                   "gap_req": max(int((requests.output_tokens - 1).sum()), 1),
                   "gap_cyc": max(int((requests.output_tokens - 1).sum()), 1),
                   "tr_reg": 4 * n + 4, "tr_t": 4 * n + 4, "tr_k": 4 * n + 4,
                   "out_t": 2 * n + 16, "out_d": (2 * n + 16, 4), "counts": 3, "params": 7,
                   "fparams": 2, "ht": heap, "hs": heap, "hd": 4 * heap})
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
        st.maxrun[r] = policies[p.role].running_cap()
        st.fabric_rate[r] = p.fabric_bytes_per_cycle
        st.link_rate[r] = p.link_bytes_per_cycle
        st.link_lat[r] = p.link_latency_cycles
    st.ptab[:], st.dtab[:], st.rtab[:] = ptab, dtab, rtab
    st.turns[:] = 1 << 30
    st.blocked_since[:] = np.nan
    st.params[cl.CACHING] = int(caching)
    st.params[cl.MAX_EVENTS] = events
    st.params[cl.REGIONS] = regions
    st.params[cl.WIDTH] = st.free.shape[1]
    st.params[cl.SESSIONS] = st.c_call.shape[1]
    st.params[cl.EVENTS] = st.ev_stage.shape[1]
    st.params[cl.HEAP] = heap
    st.fparams[cl.KV_BYTES] = options.kv_bytes_per_token
    st.fparams[cl.HEAD_BLOCKED] = np.nan
    first = np.flatnonzero(~np.isnan(requests.arrival_s))
    times = requests.arrival_s[first] * options.clock_hz
    order = np.argsort(times, kind="stable")  # by time, then by request (the order scheduled)
    return st, (np.ascontiguousarray(times[order]), order.astype(np.int64),
                first[order].astype(np.int64))


def _pack_tables(pools: list, options) -> tuple[dict, list, list, list]:
    """The distinct stage tables of ``pools``, packed end to end for the compiled loop, and
    each pool's prefill, decode and riding decode table (index, or -1)."""
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
    rtab = [add(p.riding, options.batch_limit) for p in pools]
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
    return out, ptab, dtab, rtab
