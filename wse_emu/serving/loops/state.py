"""The compiled loop's arrays, made from the requests, the pools and the options, and what the
loop leaves in them, read back: the requests as columns, each pool's queues and counters,
the pools' stage tables packed end to end (each distinct table once), the first calls'
arrivals sorted into the stream the loop merges with its heap."""

from __future__ import annotations

import time

import numpy as np

from wse_emu.serving.caps import CAP_COUNTERS
from wse_emu.serving.loops import compiled as cl
from wse_emu.serving.policies import ROUTERS
from wse_emu.serving.speculation import acceptance_runs, draft_stages_of, speculating
from wse_emu.serving.workload import Requests


def serve_compiled(requests: Requests, pools: list, options, policies: dict,
                   caching: bool) -> tuple:
    """Serve on the compiled loop: the fields of ``serve.LoopOutput``. ``policies``: each
    role's policy; ``caching``: whether the prefix cache is kept."""
    dispatch = tuple(policies[role].compiled_dispatch() for role in ("mixed", "prefill",
                                                                      "decode"))
    heap = heap_room(len(requests))
    while True:
        st = _state(requests, pools, options, policies, caching, heap)
        began = time.perf_counter()
        handled = cl.run_loop(st, dispatch)
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
                      "busy_draft": float(st.busy_draft[r]),
                      "decoded": int(st.decoded[r]), "stall": float(st.stall[r]),
                      "work": float(st.work[r]), "kv_blocked": float(st.kv_blocked[r]),
                      "reused": int(st.reused[r]), "restored": int(st.restored[r]),
                      "parked": int(st.parked[r]),
                      "kv_used": int(st.kv_used[r]),
                      **{name: int(getattr(st, name)[r]) for name in CAP_COUNTERS},
                      "trace": trace[owner == r] if len(pools) > 1 else trace,
                      "events": events})
    where = [names[w] if w >= 0 else "" for w in st.where.tolist()]
    g = st.counts[cl.GAPS]
    return (st.arrival, st.first, st.finish, st.made.copy(), where, st.from_cache.copy(),
            st.from_host.copy(), st.to_host.copy(), st.gap_req[:g].astype(np.int32),
            st.gap_cyc[:g].copy(), stats, loop_s)


def heap_room(requests: int) -> int:
    """Events the heap has room for at first. Each request has at most one event due at a
    time, and each region its dispatches: twice the requests is more than enough in practice;
    should it not be, the loop says so and runs again, on a fresh state with twice the room."""
    return 2 * requests + 64


def _state(requests: Requests, pools: list, options, policies: dict, caching: bool,
           heap: int):
    """The compiled loop's state for these requests and pools, with room for ``heap`` events
    in its heap."""
    tables, ptab, dtab, rtab, vtab = _pack_tables(pools, options)
    knobs = {role: policies[role].packed() for role in cl.ROLES}
    runs, begin = acceptance_runs(requests, options)
    sizes = _sizes(requests, pools, options, caching, heap)
    sizes["runs"] = max(len(runs), 1)
    # The packed tables and the knobs are as long as what was packed.
    sizes.update({axis: len(values) for name, values in tables.items()
                  for axis in cl.FIELD[name].axes})
    sizes["knobs"] = len(knobs["mixed"])
    st = cl.new_state(sizes)
    for name, values in tables.items():
        getattr(st, name)[:] = values
    _set_requests(st, requests, options.clock_hz)
    _set_regions(st, pools, policies)
    st.ptab[:], st.dtab[:], st.rtab[:], st.vtab[:] = ptab, dtab, rtab, vtab
    st.drafts[:] = [speculating(p)[1] for p in pools]
    st.draft_stages[:] = [draft_stages_of(p) for p in pools]
    st.runs[:len(runs)], st.run_at[:] = runs, begin[:-1]
    st.knobs_mixed[:], st.knobs_prefill[:] = knobs["mixed"], knobs["prefill"]
    st.knobs_decode[:] = knobs["decode"]
    _set_stream(st, requests, options.clock_hz)
    st.params[cl.CACHING] = int(caching)
    st.params[cl.MAX_EVENTS] = options.timeline_events
    st.params[cl.REGIONS] = len(pools)
    st.params[cl.WIDTH] = st.free.shape[1]
    st.params[cl.SESSIONS] = st.c_call.shape[1]
    st.params[cl.EVENTS] = st.ev_stage.shape[1]
    st.params[cl.HEAP] = heap
    st.params[cl.FIRST_CALLS] = len(st.stream_t)
    st.params[cl.ROUTER] = ROUTERS.index(options.router)
    if options.kv_tier == "host":
        st.params[cl.HOST_TIER] = 1
        st.host_cap[:] = options.host_tokens()
    st.fparams[cl.HOST_OVERHEAD] = options.host_transfer_overhead_s * options.clock_hz
    if requests.blocks is not None:
        st.blocks[:len(requests.blocks.ids)] = requests.blocks.ids
        st.block_at[:] = requests.blocks.at
        st.params[cl.BLOCK_TOKENS] = requests.blocks.tokens
    st.fparams[cl.KV_BYTES] = options.kv_bytes_per_token
    st.fparams[cl.HEAD_BLOCKED] = np.nan
    return st


def _sizes(requests: Requests, pools: list, options, caching: bool, heap: int) -> dict:
    """The size of each axis of the state (``compiled.FIELDS``) for this run, but those of
    what is packed (the stage tables, the knobs)."""
    n = len(requests)
    stages = max(p.stages for p in pools)
    events = options.timeline_events
    return {"requests": n, "regions": len(pools), "stages": stages,
            "sessions": (1 if not caching else requests.blocks.distinct()
                         if requests.blocks is not None else len(np.unique(requests.session))),
            "blocks": max(len(requests.blocks.ids), 1) if requests.blocks is not None else 1,
            "bounds": n + 1,
            "events": events + stages if events else 1,
            "systems": len({p.system for p in pools}),
            "gaps": max(int((requests.output_tokens - 1).sum()), 1),
            "trace": 4 * n + 4,  # KV taken and given back, on two regions at most
            "scheduled": 2 * n + 16, "heap": heap,
            "first_calls": int(np.count_nonzero(~np.isnan(requests.arrival_s)))}


def _set_requests(st, requests: Requests, clock_hz: float) -> None:
    """Each request's shape and session, sessions numbered from 0, and its session's next
    call."""
    _, session = np.unique(requests.session, return_inverse=True)
    prompt, output = requests.prompt_tokens, requests.output_tokens
    st.prompt[:], st.output[:], st.need[:] = prompt, output, prompt + output
    st.session[:], st.call[:] = session, requests.call
    st.think[:] = requests.think_s * clock_hz
    st.next_call[:] = next_calls(session, requests.call)


def next_calls(session: np.ndarray, call: np.ndarray) -> np.ndarray:
    """Per request, the request that is its session's next call (-1: none; of two requests
    of one session and call, the later in order), found by searching the requests sorted by
    (session, call), where a dictionary of every request's pair took a millisecond for a
    thousand requests, in every serving run."""
    session, call = np.asarray(session, dtype=np.int64), np.asarray(call, dtype=np.int64)
    if not len(session):
        return np.zeros(0, dtype=np.int64)
    # One number per (session, call), in the pairs' order (sessions numbered from 0, calls
    # counted from the lowest): room for every call and the one after the last.
    call = call - call.min()
    span = int(call.max()) + 2
    key = session * span + call
    order = np.argsort(key, kind="stable")  # equal pairs keep their order: the last is latest
    ranked = key[order]
    at = np.searchsorted(ranked, key + 1, side="right") - 1
    found = (at >= 0) & (ranked[np.maximum(at, 0)] == key + 1)
    return np.where(found, order[np.maximum(at, 0)], -1)


def _set_regions(st, pools: list, policies: dict) -> None:
    """Each region's role, room, hardware and running cap, and its rank by name."""
    systems = sorted({p.system for p in pools})
    order = sorted(range(len(pools)), key=lambda r: pools[r].name)
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


def _set_stream(st, requests: Requests, clock_hz: float) -> None:
    """The first calls' arrivals, in order of (time, request): their times, sequence numbers
    (the plain loop schedules them first, by request) and requests."""
    first = np.flatnonzero(~np.isnan(requests.arrival_s))
    times = requests.arrival_s[first] * clock_hz
    order = np.argsort(times, kind="stable")
    st.stream_t[:], st.stream_seq[:], st.stream_req[:] = times[order], order, first[order]


def _pack_tables(pools: list, options) -> tuple[dict, list, list, list, list]:
    """The distinct stage tables of ``pools``, packed end to end for the compiled loop, and
    each pool's prefill, decode, riding decode and verify table (index, or -1)."""
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
    vtab = [add(speculating(p)[0], options.batch_limit) for p in pools]
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
    return out, ptab, dtab, rtab, vtab
