"""The serving loop, compiled: the same events, handled the same way and in the same order, as
the plain loop in ``plain_loop.py``, on arrays instead of objects.

Everything the loop changes lives in one state of arrays (a region's queues as linked lists
through per-request arrays, its prefix cache as a least-recently-used list over sessions, the
stage tables packed end to end). ``LoopArrays`` holds them on the Python side; the compiled
code sees a ``LoopState``: a pointer to a structure of their data pointers, made on the loop's
stack. (A tuple of a hundred arrays would be copied into every call, a structure of arrays
would count a reference at every read, and one counted by reference at every call.)
Two-dimensional arrays are read row-major: row ``r`` of ``free`` starts at
``r * params[WIDTH]``.

A policy's compiled dispatch is a function of (state, region, now, knobs) with the signature
``DISPATCH``, handed to the loop as a first-class function, so that the loop never names a
policy; the primitives below (``admit``, ``send``, ``batch_size``, ...) are what a dispatch is
built from. Numba's cache does not follow a cached function into the functions it calls in
other files, so the state's type carries a digest of this file: a change here compiles every
policy's dispatch again.

Events are ordered by (time, sequence number), as the plain loop's heap orders them. First
calls arrive in order of (time, request), with the lowest sequence numbers (the plain loop
schedules them before anything else), so they are read from a sorted stream and merged with a
heap that holds only the events scheduled while serving; an event that comes before all of
those is handled at once, without the heap (a lone sequence decodes token after token so).
"""

from __future__ import annotations

import hashlib
from collections import namedtuple
from pathlib import Path

import numpy as np
from numba import njit, typeof, types
from numba.core import cgutils
from numba.core.extending import intrinsic, lower_getattr_generic, models, register_model
from numba.core.typing.templates import AttributeTemplate, infer_getattr

from wse_emu.util.progress import slow

# Region roles and event kinds, as the arrays hold them.
MIXED, PREFILL, DECODE = 0, 1, 2
ROLES = {"mixed": MIXED, "prefill": PREFILL, "decode": DECODE}
ARRIVE, DISPATCH_EVENT, DECODED, PREFILLED, JOINED = 0, 1, 2, 3, 4
# Timeline labels of a micro-batch, by what it carries.
LABELS = ("prefill", "decode", "decode+prefill")
LABEL_PREFILL, LABEL_DECODE, LABEL_BOTH = 0, 1, 2
# A cell of a stage table (``_cell``): where its line and steps start in ``lines``, the
# position between grid points, and whether it lies outside the grid.
NO_CELL = (-1, -1, 0.0, False)  # no part of that phase in the micro-batch

_FIELDS = {
    # per request
    "prompt": np.int64, "output": np.int64, "need": np.int64, "session": np.int64,
    "call": np.int64, "think": np.float64, "next_call": np.int64,
    "arrival": np.float64, "first": np.float64, "finish": np.float64, "made": np.int64,
    "last": np.float64, "where": np.int64, "progress": np.int64,
    "ctx": np.int64, "since": np.float64,  # a ready sequence's context and since when
    "nxt": np.int64,  # the next sequence in its region's ready or in-flight list
    "pnext": np.int64,  # the next prompt in its region's queue
    "hnext": np.int64, "hsrc": np.int64,  # a finished prompt's next in the handoff queue,
    # and the region it waits in
    # per region
    "role": np.int64, "cap": np.int64, "system": np.int64, "stages": np.int64,
    "rank": np.int64, "ptab": np.int64, "dtab": np.int64,
    "rtab": np.int64,  # the decode table of a step riding in a chunk's (-1: added instead)
    "maxrun": np.int64,
    "fabric_rate": np.float64, "link_rate": np.float64, "link_lat": np.float64,
    "kv_used": np.int64, "running": np.int64, "cached": np.int64, "reused": np.int64,
    "decoded": np.int64, "in_flight": np.int64, "turns": np.int64,
    "busy_prefill": np.float64, "busy_decode": np.float64, "stall": np.float64,
    "work": np.float64, "kv_blocked": np.float64, "blocked_since": np.float64,
    "dispatching": np.int64,
    "pq_head": np.int64, "pq_tail": np.int64, "pq_len": np.int64,
    "rq_head": np.int64, "rq_tail": np.int64, "rq_len": np.int64,
    "fq_head": np.int64, "fq_tail": np.int64,
    "c_head": np.int64, "c_tail": np.int64, "ev_n": np.int64,
    # a lone micro-batch not yet worked out by stage: whether there is one, when it entered,
    # and the cells its decode and prefill parts are read at
    "lz_on": np.int64, "lz_enter": np.float64,
    "lz_d0": np.int64, "lz_d1": np.int64, "lz_df": np.float64, "lz_dc": np.int64,
    "lz_p0": np.int64, "lz_p1": np.int64, "lz_pf": np.float64, "lz_pc": np.int64,
    # per region and stage (row width params[WIDTH])
    "free": np.float64, "starts": np.float64,
    "times": np.float64,  # the stages' times of the micro-batch going through (scratch)
    # per region and session: the prefix cache (call -1: nothing cached; params[SESSIONS])
    "c_call": np.int64, "c_tok": np.int64, "c_prev": np.int64, "c_next": np.int64,
    # the stage tables, packed: axes, grids (axis0 x axis1 x vector), lines kept by axis0
    "tab_x": np.float64, "tab_xo": np.int64, "tab_xn": np.int64,
    "tab_y": np.float64, "tab_yo": np.int64, "tab_yn": np.int64,
    "tab_g": np.float64, "tab_go": np.int64, "tab_k": np.int64,
    "tab_lo": np.int64, "tab_so": np.int64, "tab_amax": np.int64, "lines": np.float64,
    "line_ok": np.int64,
    # the cluster's links, by system: fabric, out, in (three a row)
    "link_free": np.float64,
    # outputs: every gap between tokens, the KV trace, the timeline (params[EVENTS] a row)
    "gap_req": np.int64, "gap_cyc": np.float64,
    "tr_reg": np.int64, "tr_t": np.float64, "tr_k": np.int64,
    "ev_stage": np.int64, "ev_start": np.float64, "ev_end": np.float64, "ev_label": np.int64,
    # the events one handled event schedules (four numbers a row), counters, parameters
    "out_t": np.float64, "out_d": np.int64,
    # the event heap: times, sequence numbers, and four numbers an event (params[HEAP] room)
    "ht": np.float64, "hs": np.int64, "hd": np.int64,
    # the finished prompts waiting for a handoff, in order (one queue)
    "hq_head": np.int64, "hq_tail": np.int64, "hq_len": np.int64,
    "counts": np.int64,  # gaps, trace entries, events scheduled
    "params": np.int64,  # caching (0/1), timeline events kept, regions, the rows' widths
    "fparams": np.float64,  # KV bytes per token, when the handoff at the queue's head
    # began waiting (NaN: it is not waiting)
}
# Fields of two dimensions, each row one region's (or system's, or event's).
_MATRICES = ("free", "starts", "c_call", "c_tok", "c_prev", "c_next", "link_free", "ev_stage",
             "ev_start", "ev_end", "ev_label", "out_d")
# counts[...], params[...], fparams[...]
GAPS, TRACE, OUT = range(3)
CACHING, MAX_EVENTS, REGIONS, WIDTH, SESSIONS, EVENTS, HEAP = range(7)
KV_BYTES, HEAD_BLOCKED = range(2)
# The field that carries this file's digest into the state's type (see the module's notes).
_DIGEST = "source_" + hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]
LoopArrays = namedtuple("LoopArrays", [*_FIELDS, _DIGEST])


def new_state(shapes: dict) -> LoopArrays:
    """A state with every array of the shape ``shapes`` gives it (missing: one element), of
    the dtype ``_FIELDS`` gives it; the loop's types follow from these alone."""
    return LoopArrays(*(np.zeros(shapes.get(name, (1, 1) if name in _MATRICES else 1),
                                 dtype=dtype) for name, dtype in _FIELDS.items()),
                      np.zeros(1, dtype=np.int64))


class LoopStateType(types.Type):
    """The compiled code's handle on a ``LoopArrays``: a pointer to a structure of their data
    pointers, read by field name (``st.free``). A plain pointer, so that no reference is
    counted when it is passed to a policy's dispatch (a structure counted by reference spent
    about a seventh of the loop's time on it). Its name carries this file's digest (the
    module's notes)."""

    def __init__(self):
        super().__init__(name="LoopState_" + _DIGEST)


ARRAYS = typeof(new_state({}))
_POINTERS = types.Tuple([types.CPointer(t.dtype) for t in ARRAYS.types])
_FIELD_INDEX = {name: k for k, name in enumerate(LoopArrays._fields)}
STATE = LoopStateType()


@register_model(LoopStateType)
class _LoopStateModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, dmm.lookup(_POINTERS).get_value_type().as_pointer())


@infer_getattr
class _LoopStateFields(AttributeTemplate):
    key = LoopStateType

    def generic_resolve(self, typ, attr):
        if attr in _FIELD_INDEX:
            return _POINTERS.types[_FIELD_INDEX[attr]]
        return None


@lower_getattr_generic(LoopStateType)
def _field(context, builder, typ, value, attr):
    return builder.load(cgutils.gep_inbounds(builder, value, 0, _FIELD_INDEX[attr]))


@intrinsic
def _state_of(typingctx, arrays):
    """The state's handle on ``arrays``: their data pointers, on the caller's stack (so only
    while the caller runs, and ``arrays`` must outlive it)."""
    def codegen(context, builder, signature, args):
        data = [context.make_array(t)(context, builder, builder.extract_value(args[0], k)).data
                for k, t in enumerate(arrays.types)]
        pointers = context.make_tuple(builder, _POINTERS, data)
        slot = cgutils.alloca_once(builder, pointers.type)
        builder.store(pointers, slot)
        return slot
    return STATE(arrays), codegen


KNOBS = types.int64[::1]
# A policy's compiled dispatch: start the next micro-batch on region r at ``now`` if there is
# one, saying whether it did.
DISPATCH = types.boolean(STATE, types.int64, types.float64, KNOBS)
DISPATCH_FUNCTION = types.FunctionType(DISPATCH)


# --- interpolation of the stage tables (as StageTable.vector does it) -----------------------

@njit(cache=True, inline="always")
def _bisect_left(values, offset, count, x) -> int:
    k = 0
    while k < count and values[offset + k] < x:
        k += 1
    return k


@njit(cache=True)
def _line(st, t, a, dest):
    """The table's grid interpolated along axis0 at ``a``, then its steps along axis1, into
    ``st.lines`` from ``dest`` on (axis1 x vector, twice)."""
    xo, xn = st.tab_xo[t], st.tab_xn[t]
    yn, k, go = st.tab_yn[t], st.tab_k[t], st.tab_go[t]
    i = _bisect_left(st.tab_x, xo, xn, a) - 1
    i = min(max(i, 0), max(xn - 2, 0))
    fx = 0.0 if xn == 1 else (a - st.tab_x[xo + i]) / (st.tab_x[xo + i + 1] - st.tab_x[xo + i])
    i1 = min(i + 1, xn - 1)
    clamp = not (0.0 <= fx <= 1.0)
    for j in range(yn):
        for e in range(k):
            v = (1 - fx) * st.tab_g[go + (i * yn + j) * k + e] \
                + fx * st.tab_g[go + (i1 * yn + j) * k + e]
            if clamp and v < 0.0:
                v = 0.0
            st.lines[dest + j * k + e] = v
    steps = dest + yn * k
    for j in range(yn):
        for e in range(k):
            st.lines[steps + j * k + e] = (st.lines[dest + (j + 1) * k + e]
                                           - st.lines[dest + j * k + e]) if j < yn - 1 else 0.0


@njit(cache=True, inline="always")
def _cell(st, t, a, b):
    """Where table ``t`` is read at (``a``, ``b``): the line at ``a`` (made when first needed)
    and its steps, at the interval of axis1 holding ``b``; the position in that interval; and
    whether it lies outside the grid (a value extended below zero is taken as zero)."""
    yn, k = st.tab_yn[t], st.tab_k[t]
    size = 2 * yn * k
    if 0 <= a <= st.tab_amax[t]:  # a line per size, made when first needed
        slot = st.tab_so[t] + a
        dest = st.tab_lo[t] + a * size
        if st.line_ok[slot] == 0:
            _line(st, t, a, dest)
            st.line_ok[slot] = 1
    else:  # beyond the sizes kept: into the spare slot after them
        dest = st.tab_lo[t] + (st.tab_amax[t] + 1) * size
        _line(st, t, a, dest)
    if yn == 1:  # the steps are zeros: the line itself
        return dest, dest + k, 0.0, False
    yo = st.tab_yo[t]
    j = _bisect_left(st.tab_y, yo, yn, b) - 1
    j = 0 if j < 0 else min(j, yn - 2)
    fy = (b - st.tab_y[yo + j]) / (st.tab_y[yo + j + 1] - st.tab_y[yo + j])
    return dest + j * k, dest + (yn + j) * k, fy, not (0.0 <= fy <= 1.0)


@njit(cache=True, inline="always")
def _element(lines, cell, e) -> float:
    """Element ``e`` of the vector read at ``cell``."""
    v = lines[cell[0] + e] + cell[2] * lines[cell[1] + e]
    if cell[3] and v < 0.0:
        v = 0.0
    return v


@njit(cache=True, inline="always")
def _stage(lines, d, p, e) -> float:
    """Element ``e`` of a micro-batch's vector, read at cells ``d`` and ``p``: the parts
    added (as the plain loop adds their vectors)."""
    if d[0] >= 0 and p[0] >= 0:
        return _element(lines, d, e) + _element(lines, p, e)
    return _element(lines, d, e) if d[0] >= 0 else _element(lines, p, e)


# --- the KV cache and the prefix cache ------------------------------------------------------

@njit(cache=True, inline="always")
def hold(st, r, tokens, now) -> None:
    """Take (or, negative, give back) KV cache, and note the occupancy."""
    st.kv_used[r] += tokens
    n = st.counts[TRACE]
    st.tr_reg[n] = r
    st.tr_t[n] = now
    st.tr_k[n] = st.kv_used[r]
    st.counts[TRACE] = n + 1


@njit(cache=True)
def _uncache(st, r, s) -> None:
    """Take session ``s``'s entry out of region ``r``'s cache list."""
    w = r * st.params[SESSIONS]
    prev, nxt = st.c_prev[w + s], st.c_next[w + s]
    if prev >= 0:
        st.c_next[w + prev] = nxt
    else:
        st.c_head[r] = nxt
    if nxt >= 0:
        st.c_prev[w + nxt] = prev
    else:
        st.c_tail[r] = prev
    st.cached[r] -= st.c_tok[w + s]
    st.c_call[w + s] = -1
    st.c_tok[w + s] = 0


@njit(cache=True)
def _keep(st, r, s, call, tokens) -> None:
    """Cache a finished call's KV for the session's next call (the newest entry last)."""
    w = r * st.params[SESSIONS]
    if st.c_call[w + s] >= 0:
        _uncache(st, r, s)
    st.c_call[w + s] = call
    st.c_tok[w + s] = tokens
    st.cached[r] += tokens
    st.c_prev[w + s] = st.c_tail[r]
    st.c_next[w + s] = -1
    if st.c_tail[r] >= 0:
        st.c_next[w + st.c_tail[r]] = s
    else:
        st.c_head[r] = s
    st.c_tail[r] = s


@njit(cache=True)
def _make_room(st, r, tokens, spare) -> bool:
    """Whether ``tokens`` of KV fit once cached KV is given up, least recently used first
    (sparing session ``spare``'s); gives it up if so."""
    cap = st.cap[r]
    if st.kv_used[r] + tokens > cap:
        return False
    if not st.params[CACHING]:
        return True
    w = r * st.params[SESSIONS]
    mine = st.c_tok[w + spare] if st.c_call[w + spare] >= 0 else 0
    over = st.kv_used[r] + st.cached[r] - mine + tokens - cap
    while over > 0:
        victim = st.c_head[r]
        if victim == spare:
            victim = st.c_next[w + victim]
        freed = st.c_tok[w + victim]
        _uncache(st, r, victim)
        over -= freed
    return True


@njit(cache=True, inline="always")
def _release(st, r, i, held, cached, now) -> None:
    """Request ``i`` leaves region ``r``: its ``held`` KV tokens are freed, ``cached`` of them
    kept for the session's next call."""
    hold(st, r, -held, now)
    st.running[r] -= 1
    if st.params[CACHING] and cached:
        _keep(st, r, st.session[i], st.call[i], cached)


# --- what a policy's dispatch is built from -------------------------------------------------

@njit(cache=True, inline="always")
def next_prompt(st, r) -> int:
    """The prompt at the head of region ``r``'s queue, or -1."""
    return st.pq_head[r] if st.pq_len[r] > 0 else -1


@njit(cache=True, inline="always")
def queued(st, r, k) -> int:
    """The ``k``-th prompt of region ``r``'s queue (0: its head), or -1."""
    if k >= st.pq_len[r]:
        return -1
    i = st.pq_head[r]
    for _ in range(k):
        i = st.pnext[i]
    return i


@njit(cache=True, inline="always")
def started(st, i) -> bool:
    """Whether prompt ``i`` was admitted (its first tiles may be under way)."""
    return st.progress[i] >= 0


@njit(cache=True, inline="always")
def remaining(st, i) -> int:
    """Tokens of admitted prompt ``i`` not yet sent."""
    return st.prompt[i] - st.progress[i]


@njit(cache=True, inline="always")
def ready(st, r) -> int:
    """Sequences waiting on region ``r`` to send their next token."""
    return st.rq_len[r]


@njit(cache=True, inline="always")
def turns(st, r) -> int:
    """Decode micro-batches sent on region ``r`` since its last prefill-only one."""
    return st.turns[r]


@njit(cache=True, inline="always")
def serves_prefill(st, r) -> bool:
    return st.ptab[r] >= 0


@njit(cache=True, inline="always")
def batch_size(st, r, limit) -> int:
    """Sequences for the next decode micro-batch: the decoding sequences spread over as many
    micro-batches as the pipeline has stages, at most ``limit``."""
    decoding = st.rq_len[r] + st.in_flight[r]
    stages = st.stages[r]
    if decoding <= stages:  # the common case, without a division
        return 1
    return min(limit, (decoding + stages - 1) // stages)


@njit(cache=True, inline="always")
def admit(st, r, i, now) -> bool:
    """Admit request ``i``, at the head of region ``r``'s queue, if its KV fits (giving up
    cached KV if need be) and the running cap allows, timing its wait otherwise. Its prompt
    starts after the prefix its session's previous call left in the cache, if still there."""
    tokens = st.need[i] if st.role[r] == MIXED else st.prompt[i]
    s = st.session[i]
    capped = st.maxrun[r] > 0 and st.role[r] != PREFILL and st.running[r] >= st.maxrun[r]
    if capped or not _make_room(st, r, tokens, s):
        if np.isnan(st.blocked_since[r]):
            st.blocked_since[r] = now
        return False
    if not np.isnan(st.blocked_since[r]):
        st.kv_blocked[r] += now - st.blocked_since[r]
        st.blocked_since[r] = np.nan
    reuse = 0
    w = r * st.params[SESSIONS]
    if st.params[CACHING] and st.c_call[w + s] >= 0:
        tok, was = st.c_tok[w + s], st.c_call[w + s]
        _uncache(st, r, s)
        if was == st.call[i] - 1:  # else stale: the session has moved on
            reuse = min(tok, st.prompt[i] - 1)
    st.reused[r] += reuse
    st.progress[i] = reuse
    st.running[r] += 1
    hold(st, r, tokens, now)
    return True


@njit(cache=True, inline="always")
def _schedule(st, t, kind, a, b, c) -> None:
    n = st.counts[OUT]
    st.out_t[n] = t
    st.out_d[4 * n] = kind
    st.out_d[4 * n + 1] = a
    st.out_d[4 * n + 2] = b
    st.out_d[4 * n + 3] = c
    st.counts[OUT] = n + 1


@njit(cache=True)
def _note(st, r, d, p, label) -> None:
    """The micro-batch's stages into the timeline (``st.starts`` holds their starts); called
    only while the timeline has room."""
    n = st.ev_n[r]
    w, e = r * st.params[WIDTH], r * st.params[EVENTS] + n
    for s in range(st.stages[r]):
        st.ev_stage[e + s] = s
        st.ev_start[e + s] = st.starts[w + s]
        st.ev_end[e + s] = st.starts[w + s] + _stage(st.lines, d, p, s)
        st.ev_label[e + s] = label
    st.ev_n[r] = n + st.stages[r]


@njit(cache=True, inline="always")
def _pass(st, r, enter, d, p, label) -> float:
    """Put a micro-batch through region ``r``: a decode step read at cell ``d`` of its decode
    table and a prefill read at cell ``p`` of its prefill table (either may be ``NO_CELL``).
    In closed form if the pipeline is idle (as ``plain_loop.Pipeline.run``: three elements of
    the vector are enough), stage by stage otherwise. Returns when it leaves the last stage."""
    stages = st.stages[r]
    w = r * st.params[WIDTH]
    lines = st.lines
    first = _stage(lines, d, p, 0)
    between = _stage(lines, d, p, stages)
    hop = between / max(stages - 1, 1)
    if enter >= st.free[w + stages - 1]:  # idle
        total = _stage(lines, d, p, stages + 1)
        done = enter + (total + between if stages > 1 else total)
        st.free[w] = enter + first
        st.free[w + stages - 1] = done
        st.lz_on[r] = 1
        st.lz_enter[r] = enter
        st.lz_d0[r], st.lz_d1[r], st.lz_df[r], st.lz_dc[r] = d[0], d[1], d[2], d[3]
        st.lz_p0[r], st.lz_p1[r], st.lz_pf[r], st.lz_pc[r] = p[0], p[1], p[2], p[3]
        if st.ev_n[r] < st.params[MAX_EVENTS]:  # the picture only: its stages' starts
            t = enter
            for s in range(stages):
                if s:
                    t += hop
                st.starts[w + s] = t
                t += _stage(lines, d, p, s)
            _note(st, r, d, p, label)
        return done
    # Stage by stage (the recurrence of ``flowshop.advance``), the lone micro-batch ahead of
    # it, if there is one, worked out alongside (as ``plain_loop.Pipeline.work_out``: the
    # recurrence on an idle pipeline, its last stage keeping the closed form's time).
    free, starts = st.free, st.starts
    t = enter
    if st.lz_on[r] == 0:
        # The stages' times first, so that the recurrence's chain of additions and maxima
        # is all that is left in its loop.
        times = st.times
        for s in range(stages):
            times[s] = _stage(lines, d, p, s)
        for s in range(stages):
            if s:
                t += hop
            f = free[w + s]
            if f > t:
                t = f
            starts[w + s] = t
            t += times[s]
            free[w + s] = t
    else:
        ld = (st.lz_d0[r], st.lz_d1[r], st.lz_df[r], st.lz_dc[r] != 0)
        lp = (st.lz_p0[r], st.lz_p1[r], st.lz_pf[r], st.lz_pc[r] != 0)
        lone_hop = _stage(lines, ld, lp, stages) / max(stages - 1, 1)
        ahead = st.lz_enter[r]
        last = free[w + stages - 1]
        for s in range(stages):
            if s:
                t += hop
                ahead += lone_hop
            ahead += _stage(lines, ld, lp, s)
            f = ahead if s < stages - 1 else last
            if f > t:
                t = f
            starts[w + s] = t
            t += _stage(lines, d, p, s)
            free[w + s] = t
    st.lz_on[r] = 0
    if st.ev_n[r] < st.params[MAX_EVENTS]:
        _note(st, r, d, p, label)
    return t


@njit(cache=True, inline="always")
def send(st, r, now, sequences, i, tokens) -> None:
    """Start one micro-batch on region ``r``: a decode step of the next ``sequences`` ready
    sequences (0: none) and the next ``tokens`` tokens of the admitted prompts from ``i``,
    the head of its queue, on (-1: none): the rest of each but the last, which may stop
    partway."""
    k = st.stages[r] + 2
    first = -1
    d = p = NO_CELL
    tokens_read = tokens
    if sequences > 0:
        total = 0
        for n in range(sequences):  # from the ready list to the in-flight list
            seq = st.rq_head[r]
            st.rq_head[r] = st.nxt[seq]
            st.nxt[seq] = -1
            if st.in_flight[r] + n > 0:
                st.nxt[st.fq_tail[r]] = seq
            else:
                st.fq_head[r] = seq
            st.fq_tail[r] = seq
            if first < 0:
                first = seq
            total += st.ctx[seq]
        st.rq_len[r] -= sequences
        # Riding in a chunk's step (``Pool.riding``), the decode's share is its own table's
        # and its sequences' tokens join the chunk's.
        merged = i >= 0 and st.rtab[r] >= 0
        d = _cell(st, st.rtab[r] if merged else st.dtab[r], sequences,
                  st.ctx[first] if sequences == 1 else total / sequences)
        if merged:
            tokens_read = tokens + sequences
    if i >= 0:
        # Several prompts' tokens are read as one chunk at their mean prefix, token-weighted.
        left, j, weighted = tokens, i, 0.0
        while left > 0:
            take = min(left, st.prompt[j] - st.progress[j])
            weighted += take * st.progress[j]
            left -= take
            j = st.pnext[j]
        p = _cell(st, st.ptab[r], tokens_read, weighted / tokens)
    label = LABEL_BOTH if sequences > 0 and i >= 0 else (
        LABEL_DECODE if sequences > 0 else LABEL_PREFILL)
    done = _pass(st, r, now, d, p, label)
    if i >= 0:
        st.busy_prefill[r] += _element(st.lines, p, k - 1)
    if sequences > 0 and i < 0:
        st.turns[r] += 1
    elif sequences == 0:
        st.turns[r] = 0
    if sequences > 0:
        # How long the tokens took beyond their own decode work: queueing for stage 0,
        # waiting behind other micro-batches, and any prompt's work riding along.
        own = _element(st.lines, d, k - 1)
        st.busy_decode[r] += own
        alone = own + _element(st.lines, d, k - 2)
        if sequences == 1:
            waited = done - st.since[first]
        else:
            waited = 0.0
            seq = first
            for _ in range(sequences):
                waited += done - st.since[seq]
                seq = st.nxt[seq]
        st.stall[r] += waited - sequences * alone
        st.work[r] += sequences * alone
        st.decoded[r] += sequences
        st.in_flight[r] += sequences
        _schedule(st, done, DECODED, r, sequences, 0)
    left = tokens if i >= 0 else 0
    while left > 0:
        j = st.pq_head[r]
        take = min(left, st.prompt[j] - st.progress[j])
        st.progress[j] += take
        left -= take
        if st.progress[j] == st.prompt[j]:  # the whole prompt is in: it leaves the queue
            st.pq_head[r] = st.pnext[j]
            st.pq_len[r] -= 1
            st.progress[j] = -1
            _schedule(st, done, PREFILLED, j, r, 0)


@njit(cache=True, inline="always")
def send_decode(st, r, now, limit) -> bool:
    """A decode micro-batch of the ready sequences, at most ``limit``, if any."""
    if st.rq_len[r] == 0 or st.dtab[r] < 0:
        return False
    send(st, r, now, min(batch_size(st, r, limit), st.rq_len[r]), -1, 0)
    return True


# --- the loop's own bookkeeping --------------------------------------------------------------

@njit(cache=True, inline="always")
def _enqueue(link, head, tail, length, q, i) -> None:
    """Append ``i`` to queue ``q`` of a set of queues kept as linked lists: ``link[i]`` the
    next in line, ``head[q]``, ``tail[q]``, ``length[q]`` each queue's ends and length."""
    link[i] = -1
    if length[q] > 0:
        link[tail[q]] = i
    else:
        head[q] = i
    tail[q] = i
    length[q] += 1


@njit(cache=True, inline="always")
def _make_ready(st, r, i, context, now) -> None:
    """Sequence ``i`` waits on region ``r`` to send its next token, at ``context``."""
    st.ctx[i] = context
    st.since[i] = now
    _enqueue(st.nxt, st.rq_head, st.rq_tail, st.rq_len, r, i)


@njit(cache=True)
def _start_handoffs(st, now) -> None:
    """Finished prompts, in order, move to the decode region with room for their whole KV
    that holds the least, over the links their transfer needs, one transfer after another."""
    while st.hq_len[0] > 0:
        i = st.hq_head[0]
        src = st.hsrc[i]
        best = -1
        for q in range(st.params[REGIONS]):
            if st.role[q] == PREFILL or st.kv_used[q] + st.need[i] > st.cap[q]:
                continue
            if st.maxrun[q] > 0 and st.running[q] >= st.maxrun[q]:
                continue
            if best < 0 or st.kv_used[q] < st.kv_used[best] or (
                    st.kv_used[q] == st.kv_used[best] and st.rank[q] < st.rank[best]):
                best = q
        if best < 0:
            if np.isnan(st.fparams[HEAD_BLOCKED]):
                st.fparams[HEAD_BLOCKED] = now
            return
        if not np.isnan(st.fparams[HEAD_BLOCKED]):
            st.kv_blocked[src] += now - st.fparams[HEAD_BLOCKED]
            st.fparams[HEAD_BLOCKED] = np.nan
        st.hq_head[0] = st.hnext[i]
        st.hq_len[0] -= 1
        hold(st, best, st.need[i], now)
        st.running[best] += 1
        sender, receiver = st.system[src], st.system[best]
        nbytes = st.prompt[i] * st.fparams[KV_BYTES]
        if sender == receiver:  # across the wafer's fabric
            done = max(now, st.link_free[3 * sender]) + nbytes / st.fabric_rate[src]
            st.link_free[3 * sender] = done
        else:  # out over one system's link and in over the other's
            rate = min(st.link_rate[src], st.link_rate[best])
            sent = max(now, st.link_free[3 * sender + 1],
                       st.link_free[3 * receiver + 2]) + nbytes / rate
            st.link_free[3 * sender + 1] = sent
            st.link_free[3 * receiver + 2] = sent
            # The network's latency delays the arrival; the links are free as the last byte
            # leaves.
            done = sent + max(st.link_lat[src], st.link_lat[best])
        _schedule(st, done, JOINED, i, best, src)


@njit(cache=True, inline="always")
def _holds(st, r, i) -> int:
    return st.need[i] if st.role[r] == MIXED else st.prompt[i]


# --- the event heap (time, then sequence number) ---------------------------------------------

@njit(cache=True, inline="always")
def _before(t1, s1, t2, s2) -> bool:
    return t1 < t2 or (t1 == t2 and s1 < s2)


@njit(cache=True, inline="always")
def _push(ht, hs, hd, n, t, s, kind, a, b, c) -> None:
    k = n
    while k > 0:
        parent = (k - 1) >> 1
        if not _before(t, s, ht[parent], hs[parent]):
            break
        ht[k], hs[k] = ht[parent], hs[parent]
        for f in range(4):
            hd[4 * k + f] = hd[4 * parent + f]
        k = parent
    ht[k], hs[k] = t, s
    hd[4 * k], hd[4 * k + 1], hd[4 * k + 2], hd[4 * k + 3] = kind, a, b, c


@njit(cache=True, inline="always")
def _pop(ht, hs, hd, n) -> None:
    """Remove the first of ``n`` events (the caller has read it)."""
    n -= 1
    t, s = ht[n], hs[n]
    d0, d1, d2, d3 = hd[4 * n], hd[4 * n + 1], hd[4 * n + 2], hd[4 * n + 3]
    k = 0
    while True:
        child = 2 * k + 1
        if child >= n:
            break
        if child + 1 < n and _before(ht[child + 1], hs[child + 1], ht[child], hs[child]):
            child += 1
        if not _before(ht[child], hs[child], t, s):
            break
        ht[k], hs[k] = ht[child], hs[child]
        for f in range(4):
            hd[4 * k + f] = hd[4 * child + f]
        k = child
    ht[k], hs[k] = t, s
    hd[4 * k], hd[4 * k + 1], hd[4 * k + 2], hd[4 * k + 3] = d0, d1, d2, d3


# --- the loop ---------------------------------------------------------------------------------

def _loop(arrays, mixed, prefill, decode, k_mixed, k_prefill, k_decode, arr_t, arr_s, arr_i):
    """Serve every request; returns the number of events handled. ``mixed``, ``prefill``,
    ``decode``: each role's dispatch, with its knobs ``k_...``; ``arr_t``, ``arr_s``,
    ``arr_i``: the first calls' arrival times, sequence numbers and requests, in order of
    (time, sequence number). Returns -1 if the heap ran out of room (``params[HEAP]``)."""
    st = _state_of(arrays)
    ht, hs, hd = st.ht, st.hs, st.hd
    cap = st.params[HEAP]
    n = 0
    seq = len(arr_t)  # the first calls took the numbers before
    ap = 0
    handled = 0
    regions = st.params[REGIONS]
    width, sessions = st.params[WIDTH], st.params[SESSIONS]
    pending = False  # an event to handle next, without the heap
    p_t, p_kind, p_a, p_b, p_c = 0.0, 0, 0, 0, 0
    while True:
        # The next event: the next first call's arrival, unless the heap's first comes before.
        if pending:
            now, kind, a, b, c = p_t, p_kind, p_a, p_b, p_c
            pending = False
        elif ap < len(arr_t) and (n == 0 or _before(arr_t[ap], arr_s[ap], ht[0], hs[0])):
            now, kind, a, b, c = arr_t[ap], ARRIVE, arr_i[ap], 0, 0
            ap += 1
        elif n > 0:
            now, kind, a, b, c = ht[0], hd[0], hd[1], hd[2], hd[3]
            _pop(ht, hs, hd, n)
            n -= 1
        else:
            break
        handled += 1
        st.counts[OUT] = 0
        kick = -1  # regions to kick once the event is handled (-1: none)
        kick2 = -1
        if kind == DECODED:
            r, size = a, b
            st.in_flight[r] -= size
            for _ in range(size):
                i = st.fq_head[r]
                st.fq_head[r] = st.nxt[i]
                st.made[i] += 1
                g = st.counts[GAPS]
                st.gap_req[g] = i
                st.gap_cyc[g] = now - st.last[i]
                st.counts[GAPS] = g + 1
                st.last[i] = now
                if st.made[i] >= st.output[i]:
                    st.finish[i] = now
                    # A colocated region caches the whole context but the newest token, whose
                    # KV was never made; a decode region caches nothing.
                    _release(st, r, i, st.need[i],
                             st.need[i] - 1 if st.role[r] == MIXED else 0, now)
                    nxt = st.next_call[i]
                    if nxt >= 0:
                        _schedule(st, now + st.think[nxt], ARRIVE, nxt, 0, 0)
                else:
                    _make_ready(st, r, i, st.ctx[i] + 1, now)
            if st.hq_len[0] > 0:
                _start_handoffs(st, now)  # KV room may have been freed
            kick = r
        elif kind == ARRIVE:
            i = a
            st.arrival[i] = now
            # Where the session's previous call is cached; else the shortest queue, then the
            # pipeline free soonest.
            home = -1
            if st.params[CACHING] and st.call[i] > 0:
                s = st.session[i]
                for q in range(regions):
                    if st.role[q] != DECODE and st.c_call[q * sessions + s] == st.call[i] - 1:
                        home = q
                        break
            if home < 0:
                for q in range(regions):
                    if st.role[q] == DECODE or _holds(st, q, i) > st.cap[q]:
                        continue
                    if home < 0:
                        home = q
                        continue
                    lq, lh = st.pq_len[q], st.pq_len[home]
                    fq = max(st.free[q * width], now)
                    fh = max(st.free[home * width], now)
                    if lq < lh or (lq == lh and (fq < fh or (fq == fh
                                                            and st.rank[q] < st.rank[home]))):
                        home = q
            _enqueue(st.pnext, st.pq_head, st.pq_tail, st.pq_len, home, i)
            kick = home
        elif kind == DISPATCH_EVENT:
            r = a
            role = st.role[r]
            free0 = st.free[r * width]
            st.dispatching[r] = 0  # this was the region's one dispatch in the heap
            if now < free0:  # due again once stage 0 is free
                st.dispatching[r] = 1
                _schedule(st, free0, DISPATCH_EVENT, r, 0, 0)
            else:
                if role == MIXED:
                    went = mixed(st, r, now, k_mixed)
                elif role == PREFILL:
                    went = prefill(st, r, now, k_prefill)
                else:
                    went = decode(st, r, now, k_decode)
                if went and (st.pq_len[r] > 0 or st.rq_len[r] > 0):
                    st.dispatching[r] = 1
                    _schedule(st, st.free[r * width], DISPATCH_EVENT, r, 0, 0)
                # else nothing waits: the next arrival or returning sequence kicks it
        elif kind == PREFILLED:
            i, r = a, b
            st.first[i] = now
            st.last[i] = now
            st.made[i] = 1
            if st.made[i] >= st.output[i]:
                st.finish[i] = now
                _release(st, r, i, _holds(st, r, i), st.prompt[i], now)
                nxt = st.next_call[i]
                if nxt >= 0:
                    _schedule(st, now + st.think[nxt], ARRIVE, nxt, 0, 0)
                kick = r
            elif st.role[r] == MIXED:
                _make_ready(st, r, i, st.prompt[i] + 1, now)
                st.where[i] = r
                kick = r
            else:  # its KV moves to a decode region once one has room
                st.hsrc[i] = r
                _enqueue(st.hnext, st.hq_head, st.hq_tail, st.hq_len, 0, i)
                _start_handoffs(st, now)
        else:  # JOINED: the transfer is done
            i, q, src = a, b, c
            _release(st, src, i, st.prompt[i], st.prompt[i], now)
            kick = src
            st.where[i] = q
            _make_ready(st, q, i, st.prompt[i] + 1, now)
            kick2 = q
        for r in (kick, kick2):
            # One dispatch per region in the heap at most: a second, due at the same stage-0
            # time, would only find the stage taken and wait again, and under load such
            # copies pile up (tens of millions of events on 20,000 requests).
            if r >= 0 and st.dispatching[r] == 0:
                st.dispatching[r] = 1
                _schedule(st, max(now, st.free[r * width]), DISPATCH_EVENT, r, 0, 0)
        if st.counts[OUT] == 1 and (n == 0 or st.out_t[0] < ht[0]) and (
                ap >= len(arr_t) or st.out_t[0] < arr_t[ap]):
            pending = True
            p_t, p_kind = st.out_t[0], st.out_d[0]
            p_a, p_b, p_c = st.out_d[1], st.out_d[2], st.out_d[3]
            seq += 1
            continue
        for e in range(st.counts[OUT]):
            if n == cap:
                return -1
            _push(ht, hs, hd, n, st.out_t[e], seq, st.out_d[4 * e], st.out_d[4 * e + 1],
                  st.out_d[4 * e + 2], st.out_d[4 * e + 3])
            n += 1
            seq += 1
    return handled


_LOOP_SIGNATURE = types.int64(ARRAYS, DISPATCH_FUNCTION, DISPATCH_FUNCTION, DISPATCH_FUNCTION,
                              KNOBS, KNOBS, KNOBS, types.float64[::1], types.int64[::1],
                              types.int64[::1])
_compiled: dict = {}
# Loading from Numba's cache takes under a second; compiling (once after install, or after
# this file or a policy's dispatch changed) takes long, and says so (``progress.slow``).
COMPILING = "compiling the serving loop (once after install: up to a minute; cached after)"


def compile_dispatch(function):
    """``function`` (a policy's dispatch, in the form numba compiles) compiled with the
    signature ``DISPATCH`` and cached, once per process."""
    if function not in _compiled:
        with slow(COMPILING):  # said only if it takes long: Numba's cache did not hold it
            _compiled[function] = njit(DISPATCH, cache=True)(function)
    return _compiled[function]


def run_loop(arrays: LoopArrays, dispatch: tuple, knobs: tuple, arr_t: np.ndarray,
             arr_s: np.ndarray, arr_i: np.ndarray) -> int:
    """Run the compiled loop on ``arrays`` (changed in place) with the roles' dispatch
    functions (mixed, prefill, decode: compiled by ``compile_dispatch``) and their knobs
    (int64 arrays)."""
    if "loop" not in _compiled:
        with slow(COMPILING):
            _compiled["loop"] = njit(_LOOP_SIGNATURE, cache=True)(_loop)
    return _compiled["loop"](arrays, *dispatch, *knobs, arr_t, arr_s, arr_i)
