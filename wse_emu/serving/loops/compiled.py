"""The serving loop, compiled: the same events, handled the same way and in the same order, as
the plain loop in ``plain.py``, on arrays instead of objects.

Each event kind of the plain loop (``Arrival``, ``Dispatch``, ``Decoded``, ``Prefilled``,
``Joined``) has its handler here (``_on_arrival``, ...), inlined into ``_loop``, which only
takes the next event and hands it to its handler.

Everything the loop changes lives in one state of arrays (a region's queues as linked lists
through per-request arrays, its prefix cache as a least-recently-used list over sessions, the
stage tables packed end to end), each declared once in ``FIELDS``: its name, dtype and the
axes it is sized by; its type and its shape for a run follow from that row alone.
``LoopArrays`` holds them on the Python side; the compiled code sees a ``LoopState``: a pointer
to a structure of their data pointers, made on the loop's stack. (A tuple of a hundred arrays
would be copied into every call, a structure of arrays would count a reference at every read,
and one counted by reference at every call.) Arrays of two axes are read row-major: row ``r``
of ``free`` starts at ``r * params[WIDTH]``.

A policy's compiled dispatch is a function of (state, region, now, knobs) with the signature
``DISPATCH``, handed to the loop as a first-class function, so that the loop never names a
policy; the primitives below (``admit``, ``send``, ``batch_size``, ...) are what a dispatch is
built from. Its knobs are read through a pointer into the state, like every other array: an
array handed from the loop to a dispatch would be counted by reference on the way, which
cost a tenth of the loop's time. Numba's cache does not follow a cached function into the
functions it calls in other files, so the state's type carries a digest of this file: a
change here compiles every policy's dispatch again.

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
from typing import NamedTuple

import numpy as np
from numba import njit, typeof, types
from numba.core import cgutils
from numba.core.extending import intrinsic, lower_getattr_generic, models, register_model
from numba.core.typing.templates import AttributeTemplate, infer_getattr

from wse_emu.util.hints import unlikely
from wse_emu.util.progress import slow

# Region roles and event kinds, as the arrays hold them.
MIXED, PREFILL, DECODE = 0, 1, 2
ROLES = {"mixed": MIXED, "prefill": PREFILL, "decode": DECODE}
ARRIVE, DISPATCH_EVENT, DECODED, PREFILLED, JOINED, RESTORED = 0, 1, 2, 3, 4, 5
# Timeline labels of a micro-batch, by what it carries.
LABELS = ("prefill", "decode", "decode+prefill", "verify")
LABEL_PREFILL, LABEL_DECODE, LABEL_BOTH, LABEL_VERIFY = 0, 1, 2, 3
# A cell of a stage table (``_cell``): where its line and steps start in ``lines``, the
# position between grid points, and whether it lies outside the grid.
NO_CELL = (-1, -1, 0.0, False)  # no part of that phase in the micro-batch

# The entries of counts[...], params[...] and fparams[...].
GAPS, TRACE, OUT = range(3)  # gaps between tokens, KV trace entries, events just scheduled
# Whether the prefix cache is kept, timeline events kept per region, regions, the widths of
# the rows of two-axis arrays, heap room, first calls in the arrival stream, a block trace's
# tokens per prefix block (0: the cache keeps sessions' contexts, not blocks), the router
# (its index in ``ROUTERS``), and the region a round-robin router tries next.
(CACHING, MAX_EVENTS, REGIONS, WIDTH, SESSIONS, EVENTS, HEAP, FIRST_CALLS, BLOCK_TOKENS, ROUTER,
 IN_TURN, HOST_TIER) = range(12)  # HOST_TIER: whether KV given up is parked in host memory
LEAST_BUSY, ROUND_ROBIN, PREFIX = range(3)  # the routers, as ``serve.ROUTERS`` names them
# KV bytes per token; when the handoff at the queue's head began waiting (NaN: it is not); the
# cycles of one transfer from the host tier besides its bytes'.
KV_BYTES, HEAD_BLOCKED, HOST_OVERHEAD = range(3)


class Field(NamedTuple):
    """One array of the loop's state: its dtype, the axes it is sized by (``state.py`` gives
    each axis its size for a run), and the value it starts at."""

    name: str
    dtype: type
    axes: tuple
    start: float = 0


INT, REAL = np.int64, np.float64
NAN, NONE = float("nan"), -1  # not yet happened; no request, region or session
PINNED = 1  # a cached block's mark while the request about to reuse it is admitted
# The axes, as ``state.py`` sizes them.
BY_REQUEST = ("requests",)
BY_REGION = ("regions",)
BY_STAGE = ("stages",)  # the longest pipeline's
BY_REGION_STAGE = ("regions", "stages")
# sessions: what the prefix cache keeps entries of, sessions or a block trace's blocks (1
# without the cache)
BY_REGION_SESSION = ("regions", "sessions")
BY_REGION_EVENT = ("regions", "events")  # events: the timeline's room for one region
BY_SYSTEM_LINK = ("systems", "links")
BY_GAP = ("gaps",)  # every gap between two tokens of a request
BY_TRACE = ("trace",)  # every change of a region's KV occupancy
BY_SCHEDULED = ("scheduled",)  # events one handled event schedules
BY_SCHEDULED_WORD = ("scheduled", "words")
BY_HEAP = ("heap",)
BY_HEAP_WORD = ("heap", "words")
BY_FIRST_CALL = ("first_calls",)  # calls that arrive by themselves, not after a previous one
BY_TABLE = ("tables",)  # the distinct stage tables, packed end to end
BY_KNOB = ("knobs",)  # the serving knobs, in the order ``Policy.packed`` gives them
# The axes of a size fixed by the loop itself.
FIXED_AXES = {"words": 4,  # an event's kind and its three numbers
              "links": 3,  # a system's fabric, its link out and its link in
              "queue": 1,  # the handoff queue: one, shared by the regions
              "counters": OUT + 1, "params": HOST_TIER + 1, "fparams": HOST_OVERHEAD + 1}

FIELDS = (
    # --- each request's shape, and where it is
    Field("prompt", INT, BY_REQUEST),
    Field("output", INT, BY_REQUEST),
    Field("need", INT, BY_REQUEST),  # KV tokens of the whole sequence
    Field("session", INT, BY_REQUEST),
    Field("call", INT, BY_REQUEST),
    Field("think", REAL, BY_REQUEST),  # cycles after the previous call finished
    Field("next_call", INT, BY_REQUEST, NONE),  # the session's next call
    Field("arrival", REAL, BY_REQUEST, NAN),
    Field("first", REAL, BY_REQUEST, NAN),
    Field("finish", REAL, BY_REQUEST, NAN),
    Field("made", INT, BY_REQUEST),  # tokens out
    Field("last", REAL, BY_REQUEST),  # when its last token came out
    Field("where", INT, BY_REQUEST, NONE),  # the region it decodes on
    Field("progress", INT, BY_REQUEST, NONE),  # prompt tokens sent (-1: not admitted)
    Field("ctx", INT, BY_REQUEST),  # a ready sequence's context
    Field("since", REAL, BY_REQUEST),  # and since when it is ready
    Field("nxt", INT, BY_REQUEST, NONE),  # the next in its region's ready or in-flight list
    Field("pnext", INT, BY_REQUEST, NONE),  # the next prompt in its region's queue
    Field("hnext", INT, BY_REQUEST, NONE),  # a finished prompt's next in the handoff queue
    Field("hsrc", INT, BY_REQUEST, NONE),  # and the region it waits in
    Field("run_at", INT, BY_REQUEST),  # where its next acceptance run is in ``runs``
    Field("from_cache", INT, BY_REQUEST),  # prompt tokens its region had cached
    Field("from_host", INT, BY_REQUEST),  # of those, tokens brought back from the host tier
    Field("to_host", INT, BY_REQUEST),  # KV tokens parked in the host tier to admit it
    # A block trace's prompts: request i's prefix blocks are blocks[block_at[i]:block_at[i+1]]
    Field("blocks", INT, ("blocks",)),
    Field("block_at", INT, ("bounds",)),
    Field("spare", INT, ("blocks",)),  # room to hold a request's blocks' sizes for a moment
    # --- each region's hardware and policy
    Field("role", INT, BY_REGION),
    Field("cap", INT, BY_REGION),  # KV tokens it holds
    Field("system", INT, BY_REGION),
    Field("stages", INT, BY_REGION),
    Field("rank", INT, BY_REGION),  # its place in the order of names (ties go to the first)
    Field("ptab", INT, BY_REGION),  # its prefill table (-1: none)
    Field("dtab", INT, BY_REGION),  # its decode table (-1: none)
    Field("rtab", INT, BY_REGION),  # the decode table of a step riding in a chunk's
    # (-1: added instead)
    Field("vtab", INT, BY_REGION),  # a verify step's later tiles' table (-1: no speculation)
    Field("drafts", INT, BY_REGION),  # and the drafted tokens each verify step checks
    Field("draft_stages", INT, BY_REGION),  # the draft's, first in the pipeline
    Field("maxrun", INT, BY_REGION),  # the running cap (0: none)
    Field("fabric_rate", REAL, BY_REGION),  # bytes per cycle of a handoff, in a system
    Field("link_rate", REAL, BY_REGION),  # and between systems
    Field("link_lat", REAL, BY_REGION),
    # --- each role's policy: the knobs its dispatch reads
    Field("knobs_mixed", INT, BY_KNOB),
    Field("knobs_prefill", INT, BY_KNOB),
    Field("knobs_decode", INT, BY_KNOB),
    # --- each region's KV cache and counters
    Field("kv_used", INT, BY_REGION),
    Field("running", INT, BY_REGION),  # sequences holding KV
    Field("cached", INT, BY_REGION),  # KV tokens of the prefix cache
    Field("reused", INT, BY_REGION),
    Field("restored", INT, BY_REGION),  # of those, tokens brought back from the host tier
    Field("parked", INT, BY_REGION),  # KV tokens sent to the host tier
    Field("decoded", INT, BY_REGION),
    Field("in_flight", INT, BY_REGION),  # sequences whose token is in the pipeline
    Field("turns", INT, BY_REGION, 1 << 30),  # decode micro-batches since a prefill-only one
    Field("busy_prefill", REAL, BY_REGION),
    Field("busy_decode", REAL, BY_REGION),
    Field("busy_draft", REAL, BY_REGION),  # of busy_decode: in the draft's stages
    Field("stall", REAL, BY_REGION),
    Field("work", REAL, BY_REGION),
    Field("kv_blocked", REAL, BY_REGION),
    Field("blocked_since", REAL, BY_REGION, NAN),
    # What the caps decided (``serving.caps``): the most sequences a running-cap check found
    # holding KV, and the checks that found the cap reached; the most sequences a decode
    # micro-batch asked for, and the micro-batches the limit cut.
    Field("running_peak", INT, BY_REGION),
    Field("running_met", INT, BY_REGION),
    Field("batch_peak", INT, BY_REGION),
    Field("batch_met", INT, BY_REGION),
    Field("dispatching", INT, BY_REGION),  # its one dispatch is in the heap
    # --- each region's queues, as linked lists: prompts, ready and in-flight sequences
    Field("pq_head", INT, BY_REGION),
    Field("pq_tail", INT, BY_REGION),
    Field("pq_len", INT, BY_REGION),
    Field("rq_head", INT, BY_REGION),
    Field("rq_tail", INT, BY_REGION),
    Field("rq_len", INT, BY_REGION),
    Field("fq_head", INT, BY_REGION),
    Field("fq_tail", INT, BY_REGION),
    Field("c_head", INT, BY_REGION, NONE),  # the prefix cache, least recently used first
    Field("c_tail", INT, BY_REGION, NONE),
    Field("ev_n", INT, BY_REGION),  # timeline events kept
    # --- each region's lone micro-batch not yet worked out by stage: whether there is one,
    # when it entered, and the cells its decode and prefill parts are read at
    Field("lz_on", INT, BY_REGION),
    Field("lz_enter", REAL, BY_REGION),
    Field("lz_d0", INT, BY_REGION),
    Field("lz_d1", INT, BY_REGION),
    Field("lz_df", REAL, BY_REGION),
    Field("lz_dc", INT, BY_REGION),
    Field("lz_p0", INT, BY_REGION),
    Field("lz_p1", INT, BY_REGION),
    Field("lz_pf", REAL, BY_REGION),
    Field("lz_pc", INT, BY_REGION),
    # --- each region's stages
    Field("free", REAL, BY_REGION_STAGE),  # when each is free
    Field("starts", REAL, BY_REGION_STAGE),  # when the last micro-batch started each
    Field("times", REAL, BY_STAGE),  # the stages' times of the micro-batch going through
    # --- each region's prefix cache, by session or block (call -1: nothing cached; a block's
    # call is 0, and PINNED while a request admitted beside it spares it)
    Field("c_call", INT, BY_REGION_SESSION, NONE),
    Field("c_tok", INT, BY_REGION_SESSION),
    Field("c_prev", INT, BY_REGION_SESSION, NONE),
    Field("c_next", INT, BY_REGION_SESSION, NONE),
    # --- each region's host tier, as its cache (``plain.KVSpace.host``)
    Field("h_call", INT, BY_REGION_SESSION, NONE),
    Field("h_tok", INT, BY_REGION_SESSION),
    Field("h_prev", INT, BY_REGION_SESSION, NONE),
    Field("h_next", INT, BY_REGION_SESSION, NONE),
    Field("h_head", INT, BY_REGION, NONE),
    Field("h_tail", INT, BY_REGION, NONE),
    Field("hosted", INT, BY_REGION),
    Field("host_cap", INT, BY_REGION),
    # --- the stage tables, packed: each one's axes, its grid (axis0 x axis1 x vector), and
    # the lines interpolated along axis0 kept by size
    Field("tab_x", REAL, ("axis0_points",)),
    Field("tab_xo", INT, BY_TABLE),
    Field("tab_xn", INT, BY_TABLE),
    Field("tab_y", REAL, ("axis1_points",)),
    Field("tab_yo", INT, BY_TABLE),
    Field("tab_yn", INT, BY_TABLE),
    Field("tab_g", REAL, ("grid_values",)),
    Field("tab_go", INT, BY_TABLE),
    Field("tab_k", INT, BY_TABLE),  # the vector's length
    Field("tab_lo", INT, BY_TABLE),  # where its lines start in ``lines``
    Field("tab_so", INT, BY_TABLE),  # and their slots in ``line_ok``
    Field("tab_amax", INT, BY_TABLE),  # the largest size kept
    Field("lines", REAL, ("line_values",)),
    Field("line_ok", INT, ("line_slots",)),
    # --- the cluster's links, by system
    Field("link_free", REAL, BY_SYSTEM_LINK),
    # --- speculative decoding's acceptance runs, every request's in turn
    Field("runs", INT, ("runs",)),
    # --- outputs: every gap between tokens, the KV trace, the timeline
    Field("gap_req", INT, BY_GAP),
    Field("gap_cyc", REAL, BY_GAP),
    Field("tr_reg", INT, BY_TRACE),
    Field("tr_t", REAL, BY_TRACE),
    Field("tr_k", INT, BY_TRACE),
    Field("ev_stage", INT, BY_REGION_EVENT),
    Field("ev_start", REAL, BY_REGION_EVENT),
    Field("ev_end", REAL, BY_REGION_EVENT),
    Field("ev_label", INT, BY_REGION_EVENT),
    # --- the events: those one handled event schedules, the heap of those due, the first
    # calls' arrival stream (times, sequence numbers, requests; in order)
    Field("out_t", REAL, BY_SCHEDULED),
    Field("out_d", INT, BY_SCHEDULED_WORD),
    Field("ht", REAL, BY_HEAP),
    Field("hs", INT, BY_HEAP),
    Field("hd", INT, BY_HEAP_WORD),
    Field("stream_t", REAL, BY_FIRST_CALL),
    Field("stream_seq", INT, BY_FIRST_CALL),
    Field("stream_req", INT, BY_FIRST_CALL),
    # --- the finished prompts waiting for a handoff, in order
    Field("hq_head", INT, ("queue",)),
    Field("hq_tail", INT, ("queue",)),
    Field("hq_len", INT, ("queue",)),
    # --- counters and parameters (GAPS, ...; CACHING, ...; KV_BYTES, ...)
    Field("counts", INT, ("counters",)),
    Field("params", INT, ("params",)),
    Field("fparams", REAL, ("fparams",)),
)
FIELD = {f.name: f for f in FIELDS}
AXES = sorted({axis for f in FIELDS for axis in f.axes} - set(FIXED_AXES))
# The field that carries this file's digest into the state's type (see the module's notes).
_DIGEST = "source_" + hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]
LoopArrays = namedtuple("LoopArrays", [*(f.name for f in FIELDS), _DIGEST])


def new_state(sizes: dict) -> LoopArrays:
    """A state with every array sized by its axes (``sizes``: every one of ``AXES``) and set
    to its start value; the loop's types follow from ``FIELDS`` alone."""
    sizes = {**sizes, **FIXED_AXES}
    return LoopArrays(*(_new_array([sizes[axis] for axis in f.axes], f.start, f.dtype)
                        for f in FIELDS),
                      np.zeros(1, dtype=np.int64))


def _new_array(shape: list, start: float, dtype) -> np.ndarray:
    # Zeros come from pages the system zeroes when first written, so that the large outputs
    # (every gap between tokens) cost nothing until the loop fills them.
    if start == 0:
        return np.zeros(shape, dtype=dtype)
    return np.full(shape, start, dtype=dtype)


class LoopStateType(types.Type):
    """The compiled code's handle on a ``LoopArrays``: a pointer to a structure of their data
    pointers, read by field name (``st.free``). A plain pointer, so that no reference is
    counted when it is passed to a policy's dispatch (a structure counted by reference spent
    about a seventh of the loop's time on it). Its name carries this file's digest (the
    module's notes)."""

    def __init__(self):
        super().__init__(name="LoopState_" + _DIGEST)


ARRAYS = typeof(new_state(dict.fromkeys(AXES, 1)))
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


KNOBS = types.CPointer(types.int64)
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


# The prefix cache and the host tier are each a list per region, least recently used first,
# of entries by session (or block) ``s``: links ``prev``/``nxt`` at ``w + s`` (``w`` the
# region's row), ends ``head``/``tail`` at ``r``.

@njit(cache=True, inline="always")
def _unlink(prev, nxt, head, tail, w, r, s) -> None:
    """Take entry ``s`` out of region ``r``'s list."""
    before, after = prev[w + s], nxt[w + s]
    if before >= 0:
        nxt[w + before] = after
    else:
        head[r] = after
    if after >= 0:
        prev[w + after] = before
    else:
        tail[r] = before


@njit(cache=True, inline="always")
def _append(prev, nxt, head, tail, w, r, s) -> None:
    """Put entry ``s`` at the end of region ``r``'s list (the most recently used)."""
    prev[w + s] = tail[r]
    nxt[w + s] = -1
    if tail[r] >= 0:
        nxt[w + tail[r]] = s
    else:
        head[r] = s
    tail[r] = s


@njit(cache=True)
def _uncache(st, r, s) -> None:
    """Take session ``s``'s entry out of region ``r``'s cache list."""
    w = r * st.params[SESSIONS]
    _unlink(st.c_prev, st.c_next, st.c_head, st.c_tail, w, r, s)
    st.cached[r] -= st.c_tok[w + s]
    st.c_call[w + s] = -1
    st.c_tok[w + s] = 0


@njit(cache=True)
def _keep(st, r, s, call, tokens) -> None:
    """Cache a finished call's KV for the session's next call (the newest entry last)."""
    w = r * st.params[SESSIONS]
    if st.c_call[w + s] >= 0:
        _uncache(st, r, s)
    _unpark(st, r, s)  # an older copy in the host tier is superseded
    st.c_call[w + s] = call
    st.c_tok[w + s] = tokens
    st.cached[r] += tokens
    _append(st.c_prev, st.c_next, st.c_head, st.c_tail, w, r, s)


@njit(cache=True)
def _make_room(st, r, tokens, spare, i) -> bool:
    """Whether ``tokens`` of KV fit once cached KV is given up, least recently used first
    (sparing session ``spare``'s), for request ``i``; gives it up if so."""
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
        freed, call = st.c_tok[w + victim], st.c_call[w + victim]
        _uncache(st, r, victim)
        over -= freed
        _park(st, r, victim, call, freed, i)
    return True


@njit(cache=True)
def _unpark(st, r, s) -> int:
    """Take entry ``s`` out of region ``r``'s host tier; its tokens (0: it held none)."""
    w = r * st.params[SESSIONS]
    if st.h_call[w + s] < 0:
        return 0
    _unlink(st.h_prev, st.h_next, st.h_head, st.h_tail, w, r, s)
    tokens = st.h_tok[w + s]
    st.hosted[r] -= tokens
    st.h_call[w + s] = -1
    st.h_tok[w + s] = 0
    return tokens


@njit(cache=True)
def _park(st, r, s, call, tokens, i) -> None:
    """An entry the cache gave up to admit request ``i``, kept in the host tier (its oldest
    given up for room; counted as parked for ``i``); dropped without a tier, or when larger
    than the tier."""
    _unpark(st, r, s)
    if tokens > st.host_cap[r]:
        return
    st.to_host[i] += tokens
    st.parked[r] += tokens
    w = r * st.params[SESSIONS]
    while st.hosted[r] + tokens > st.host_cap[r]:
        _unpark(st, r, st.h_head[r])
    st.h_call[w + s] = call
    st.h_tok[w + s] = tokens
    st.hosted[r] += tokens
    _append(st.h_prev, st.h_next, st.h_head, st.h_tail, w, r, s)


@njit(cache=True)
def _recompute(st, r, tokens, prefix) -> float:
    """Cycles region ``r`` would take to compute ``tokens`` of a prompt after ``prefix``
    cached ones again: tiles of its table's largest size through its slowest stage."""
    t = st.ptab[r]
    top = int(st.tab_x[st.tab_xo[t] + st.tab_xn[t] - 1])
    tile = min(tokens, top)
    cell = _cell(st, t, tile, prefix)
    slowest = 0.0
    for s in range(st.stages[r]):
        slowest = max(slowest, _element(st.lines, cell, s))
    return slowest * ((tokens + tile - 1) // tile)


@njit(cache=True)
def _restore(st, r, i, first, prefix, now):
    """``plain.Simulation.restore``: as request ``i`` is admitted on region ``r`` with
    ``prefix`` tokens of its prompt from the cache (a block trace's: blocks before its
    ``first``), the KV of its prompt parked in the host tier that follows, taken out of it
    and brought back when that is quicker than computing it again: (its tokens, when it is
    back), or (0, -1)."""
    if not st.params[HOST_TIER] or not st.params[CACHING]:
        return 0, -1.0
    w = r * st.params[SESSIONS]
    tokens = 0
    last = first
    if st.params[BLOCK_TOKENS] > 0:
        end = st.block_at[i + 1]
        while last < end and st.h_call[w + st.blocks[last]] >= 0:
            tokens += st.h_tok[w + st.blocks[last]]
            last += 1
    else:
        s = st.session[i]
        if st.h_call[w + s] >= 0 and st.h_call[w + s] == st.call[i] - 1:
            tokens = st.h_tok[w + s]
    if tokens == 0:
        return 0, -1.0
    back = st.fparams[HOST_OVERHEAD] + tokens * st.fparams[KV_BYTES] / st.link_rate[r]
    if back >= _recompute(st, r, tokens, prefix):
        return 0, -1.0
    if st.params[BLOCK_TOKENS] > 0:
        for k in range(first, last):
            _unpark(st, r, st.blocks[k])
    else:
        _unpark(st, r, st.session[i])
    link = 3 * st.system[r] + 2  # the system's link in
    done = max(now, st.link_free[link]) + back
    st.link_free[link] = done
    return tokens, done


@njit(cache=True)
def _block_room(st, r, i, tokens) -> bool:
    """``_make_room`` for a block trace's request ``i``: sparing the leading blocks of its
    prompt that region ``r`` has cached, which it is about to reuse."""
    cap = st.cap[r]
    if st.kv_used[r] + tokens > cap:
        return False
    if not st.params[CACHING]:
        return True
    w = r * st.params[SESSIONS]
    mine = 0
    end = st.block_at[i]
    while end < st.block_at[i + 1] and st.c_call[w + st.blocks[end]] >= 0:
        st.c_call[w + st.blocks[end]] = PINNED
        mine += st.c_tok[w + st.blocks[end]]
        end += 1
    over = st.kv_used[r] + st.cached[r] - mine + tokens - cap
    victim = st.c_head[r]
    while over > 0:
        while st.c_call[w + victim] == PINNED:
            victim = st.c_next[w + victim]
        after = st.c_next[w + victim]
        freed, call = st.c_tok[w + victim], st.c_call[w + victim]
        over -= freed
        _uncache(st, r, victim)
        _park(st, r, victim, call, freed, i)
        victim = after
    for k in range(st.block_at[i], end):
        st.c_call[w + st.blocks[k]] = 0
    return True


@njit(cache=True)
def _take_blocks(st, r, i):
    """Request ``i``'s leading blocks region ``r``'s cache holds, taken out of it (the
    request holds them now): their tokens, and where in ``blocks`` they end."""
    k = st.block_at[i]
    if not st.params[CACHING]:
        return 0, k
    w = r * st.params[SESSIONS]
    got = 0
    while k < st.block_at[i + 1] and st.c_call[w + st.blocks[k]] >= 0:
        got += st.c_tok[w + st.blocks[k]]
        _uncache(st, r, st.blocks[k])
        k += 1
    return got, k


@njit(cache=True)
def _keep_blocks(st, r, i) -> None:
    """Cache request ``i``'s prompt block by block, newest last: those already cached (by
    another request sharing them) stay where they are, its copy given up."""
    size, prompt = st.params[BLOCK_TOKENS], st.prompt[i]
    w = r * st.params[SESSIONS]
    j = 0
    for k in range(st.block_at[i], st.block_at[i + 1]):
        if st.c_call[w + st.blocks[k]] < 0:
            _keep(st, r, st.blocks[k], 0, min(size, prompt - j * size))
        j += 1


@njit(cache=True, inline="always")
def _release(st, r, i, held, cached, now) -> None:
    """Request ``i`` leaves region ``r``: its ``held`` KV tokens are freed, ``cached`` of them
    kept for the session's next call (a block trace's: its prompt's blocks)."""
    hold(st, r, -held, now)
    st.running[r] -= 1
    if st.params[CACHING] and cached:
        if st.params[BLOCK_TOKENS] > 0:
            _keep_blocks(st, r, i)
        else:
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
    micro-batches as the pipeline has stages, at most ``limit``. What it asks for of the
    ready sequences, and whether ``limit`` cut that, is noted (``serving.caps``)."""
    decoding = st.rq_len[r] + st.in_flight[r]
    stages = st.stages[r]
    # (the common case, without a division, first)
    want = 1 if decoding <= stages else (decoding + stages - 1) // stages
    asked = min(want, st.rq_len[r])  # the callers take no more than are ready
    if asked > st.batch_peak[r]:
        st.batch_peak[r] = asked
    if asked > limit:
        st.batch_met[r] += 1
    return min(limit, want)


@njit(cache=True, inline="always")
def _capped(st, r) -> bool:
    """Whether region ``r``'s running cap stops another sequence now; what it found is noted
    (``serving.caps``)."""
    n = st.running[r]
    if n > st.running_peak[r]:
        st.running_peak[r] = n
    if st.maxrun[r] > 0 and n >= st.maxrun[r]:
        st.running_met[r] += 1
        return True
    return False


@njit(cache=True)
def admit(st, r, i, now) -> bool:
    """Admit request ``i``, at the head of region ``r``'s queue, if its KV fits (giving up
    cached KV if need be) and the running cap allows, timing its wait otherwise. Its prompt
    starts after the prefix its session's previous call left in the cache, if still there."""
    tokens = st.need[i] if st.role[r] == MIXED else st.prompt[i]
    s = st.session[i]
    blocky = st.params[BLOCK_TOKENS] > 0
    capped = st.role[r] != PREFILL and _capped(st, r)
    if capped or not (_block_room(st, r, i, tokens) if blocky
                      else _make_room(st, r, tokens, s, i)):
        if np.isnan(st.blocked_since[r]):
            st.blocked_since[r] = now
        return False
    if st.to_host[i] > 0:
        # What its room gave up to the host tier goes out over the system's link, in one
        # transfer behind whatever uses the link already (the handoffs out). Written behind:
        # the link drains KV faster than a prompt fills it, so the prompt does not wait.
        link = 3 * st.system[r] + 1  # the system's link out
        out = st.fparams[HOST_OVERHEAD] + st.to_host[i] * st.fparams[KV_BYTES] \
            / st.link_rate[r]
        st.link_free[link] = max(now, st.link_free[link]) + out
    if not np.isnan(st.blocked_since[r]):
        st.kv_blocked[r] += now - st.blocked_since[r]
        st.blocked_since[r] = np.nan
    cached, first = 0, 0
    w = r * st.params[SESSIONS]
    if blocky:
        cached, first = _take_blocks(st, r, i)
    elif st.params[CACHING] and st.c_call[w + s] >= 0:
        tok, was = st.c_tok[w + s], st.c_call[w + s]
        _uncache(st, r, s)
        if was == st.call[i] - 1:  # else stale: the session has moved on
            cached = tok
    back, done = _restore(st, r, i, first, cached, now)
    reuse = min(cached + back, st.prompt[i] - 1)
    st.reused[r] += reuse
    st.from_cache[i] = reuse
    st.progress[i] = reuse
    st.running[r] += 1
    hold(st, r, tokens, now)
    if done < 0.0:
        return True
    # Its prompt goes on once the KV is back from the host tier: out of the queue until then.
    # Of the tokens reused, those the tier brought back (a prompt's last token is computed
    # whatever was cached).
    host = min(back, reuse - min(cached, reuse))
    st.restored[r] += host
    st.from_host[i] = host
    _unqueue(st, r, i)
    _schedule(st, done, RESTORED, i, r, 0)
    return False


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
        # is all that is left in its loop. A stage still busy is a branch, not a maximum
        # (``util.hints``): the chain then waits on its additions alone.
        times = st.times
        for s in range(stages):
            times[s] = _stage(lines, d, p, s)
        for s in range(stages):
            if s:
                t += hop
            f = free[w + s]
            if unlikely(f > t):
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
            if unlikely(f > t):
                t = f
            starts[w + s] = t
            t += _stage(lines, d, p, s)
            free[w + s] = t
    st.lz_on[r] = 0
    if st.ev_n[r] < st.params[MAX_EVENTS]:
        _note(st, r, d, p, label)
    return t


@njit(cache=True)
def send(st, r, now, sequences, i, tokens) -> None:
    """Start one micro-batch on region ``r``: a decode step of the next ``sequences`` ready
    sequences (0: none) and the next ``tokens`` tokens of the admitted prompts from ``i``,
    the head of its queue, on (-1: none): the rest of each but the last, which may stop
    partway."""
    k = st.stages[r] + 2
    first = -1
    d = p = NO_CELL
    tokens_read = tokens
    context = 0.0
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
        context = st.ctx[first] if sequences == 1 else total / sequences
        d = _cell(st, st.rtab[r] if merged else st.dtab[r], sequences, context)
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
        for s in range(st.draft_stages[r]):
            st.busy_draft[r] += _element(st.lines, d, s)
        alone = own + _element(st.lines, d, k - 2)
        verified = done  # when the decode's tokens are out
        if st.drafts[r] > 0:
            # A verify step: the later tiles follow the first, one per drafted token.
            v = _cell(st, st.vtab[r], sequences, context)
            slowest = 0.0
            for s in range(k - 2):
                slowest = max(slowest, _element(st.lines, v, s))
            for _ in range(st.drafts[r]):
                st.busy_decode[r] += _element(st.lines, v, k - 1)
                verified = _pass(st, r, now, v, NO_CELL, LABEL_VERIFY)
            alone += st.drafts[r] * slowest  # its later tiles, at its slowest stage's pace
        if sequences == 1:
            waited = verified - st.since[first]
        else:
            waited = 0.0
            seq = first
            for _ in range(sequences):
                waited += verified - st.since[seq]
                seq = st.nxt[seq]
        st.stall[r] += waited - sequences * alone
        st.work[r] += sequences * alone
        st.in_flight[r] += sequences
        _schedule(st, verified, DECODED, r, sequences, 0)
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


@njit(cache=True)
def send_decode(st, r, now, limit) -> bool:
    """A decode micro-batch of the ready sequences, at most ``limit``, if any."""
    if st.rq_len[r] == 0 or st.dtab[r] < 0:
        return False
    send(st, r, now, min(batch_size(st, r, limit), st.rq_len[r]), -1, 0)
    return True


# --- the loop's own bookkeeping (as ``plain.Simulation``'s) ----------------------------------

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


@njit(cache=True, inline="always")
def _kick(st, r, now) -> None:
    """A dispatch of region ``r`` once its stage 0 is free, unless one is in the heap already:
    a second, due at the same stage-0 time, would only find the stage taken and wait again,
    and under load such copies pile up (tens of millions of events on 20,000 requests)."""
    if st.dispatching[r] == 0:
        st.dispatching[r] = 1
        _schedule(st, max(now, st.free[r * st.params[WIDTH]]), DISPATCH_EVENT, r, 0, 0)


@njit(cache=True, inline="always")
def _holds(st, r, i) -> int:
    """KV tokens request ``i`` takes on entering region ``r``: a colocated region keeps the
    sequence's whole KV, a prefill region only the prompt's, until the handoff."""
    return st.need[i] if st.role[r] == MIXED else st.prompt[i]


@njit(cache=True, inline="always")
def _finish(st, r, i, now, held, cached) -> None:
    """Request ``i`` has its last token: it leaves region ``r`` (``_release``), and its
    session's next call, if any, arrives after its think time."""
    st.finish[i] = now
    _release(st, r, i, held, cached, now)
    nxt = st.next_call[i]
    if nxt >= 0:
        _schedule(st, now + st.think[nxt], ARRIVE, nxt, 0, 0)


@njit(cache=True)
def _start_handoffs(st, now) -> None:
    """Finished prompts, in order, move to the decode region with room for their whole KV
    that holds the least, over the links their transfer needs, one transfer after another."""
    while st.hq_len[0] > 0:
        i = st.hq_head[0]
        src = st.hsrc[i]
        best = _handoff_target(st, i)
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
        _schedule(st, _transfer(st, i, src, best, now), JOINED, i, best, src)


@njit(cache=True, inline="always")
def _handoff_target(st, i) -> int:
    """The region that would take request ``i``'s KV: of those that decode, with room for it
    under the running cap, the one that holds the least (-1: none has room)."""
    best = -1
    for q in range(st.params[REGIONS]):
        if st.role[q] == PREFILL or st.kv_used[q] + st.need[i] > st.cap[q]:
            continue
        if _capped(st, q):
            continue
        if best < 0 or st.kv_used[q] < st.kv_used[best] or (
                st.kv_used[q] == st.kv_used[best] and st.rank[q] < st.rank[best]):
            best = q
    return best


@njit(cache=True, inline="always")
def _transfer(st, i, src, dst, now) -> float:
    """Request ``i``'s prompt KV sent from region ``src`` to ``dst`` over the links between
    them, once each is free; returns when it has arrived."""
    sender, receiver = st.system[src], st.system[dst]
    nbytes = st.prompt[i] * st.fparams[KV_BYTES]
    if sender == receiver:  # across the wafer's fabric
        done = max(now, st.link_free[3 * sender]) + nbytes / st.fabric_rate[src]
        st.link_free[3 * sender] = done
        return done
    # out over one system's link and in over the other's
    rate = min(st.link_rate[src], st.link_rate[dst])
    sent = max(now, st.link_free[3 * sender + 1], st.link_free[3 * receiver + 2]) + nbytes / rate
    st.link_free[3 * sender + 1] = sent
    st.link_free[3 * receiver + 2] = sent
    # The network's latency delays the arrival; the links are free as the last byte leaves.
    return sent + max(st.link_lat[src], st.link_lat[dst])


# --- the events, one handler each (as ``plain.py``'s event classes) -------------------------

@njit(cache=True, inline="always")
def _on_arrival(st, now, i) -> None:
    """``plain.Arrival``: call ``i`` joins the queue its router picks. Least busy (and prefix):
    the region that holds its session's previous call, if one does; prefix, for a block
    trace: the region caching most of its leading blocks, if any does; round robin: the next
    region in turn that can hold it; else the one with the shortest queue, then the pipeline
    free soonest."""
    st.arrival[i] = now
    router = st.params[ROUTER]
    home = -1
    if router != ROUND_ROBIN:
        home = _cached_home(st, i)
    if home < 0 and router == PREFIX:
        home = _prefix_home(st, i, now)
    if home < 0 and router == ROUND_ROBIN:
        home = _in_turn(st, i)
    if home < 0:
        home = _least_busy(st, i, now)
    _enqueue(st.pnext, st.pq_head, st.pq_tail, st.pq_len, home, i)
    _kick(st, home, now)


@njit(cache=True, inline="always")
def _on_restored(st, now, i, r) -> None:
    """``plain.Restored``: admitted request ``i``'s KV is back from the host tier: it rejoins
    region ``r``'s queue at the head."""
    st.pnext[i] = st.pq_head[r] if st.pq_len[r] > 0 else -1
    st.pq_head[r] = i
    if st.pq_len[r] == 0:
        st.pq_tail[r] = i
    st.pq_len[r] += 1
    _kick(st, r, now)


@njit(cache=True)
def _unqueue(st, r, i) -> None:
    """Take prompt ``i`` out of region ``r``'s queue, wherever it stands."""
    prev, j = -1, st.pq_head[r]
    for _ in range(st.pq_len[r]):
        if j == i:
            break
        prev, j = j, st.pnext[j]
    if prev < 0:
        st.pq_head[r] = st.pnext[i]
    else:
        st.pnext[prev] = st.pnext[i]
    if st.pq_tail[r] == i:
        st.pq_tail[r] = prev
    st.pq_len[r] -= 1


@njit(cache=True, inline="always")
def _cached_home(st, i) -> int:
    """The region whose prefix cache holds the previous call of request ``i``'s session
    (-1: none does, or nothing is cached)."""
    if not st.params[CACHING] or st.call[i] <= 0:
        return -1
    s, sessions = st.session[i], st.params[SESSIONS]
    for q in range(st.params[REGIONS]):
        if st.role[q] == DECODE:
            continue
        w = q * sessions + s
        # in its cache or, else, its host tier (as ``plain.Simulation.holds_session``)
        call = st.c_call[w] if st.c_call[w] >= 0 else st.h_call[w]
        if call == st.call[i] - 1:
            return q
    return -1


@njit(cache=True, inline="always")
def _less_busy(st, q, home, now) -> bool:
    """Whether region ``q`` has a shorter queue than ``home``, then its pipeline free sooner,
    then comes first by name."""
    width = st.params[WIDTH]
    lq, lh = st.pq_len[q], st.pq_len[home]
    fq = max(st.free[q * width], now)
    fh = max(st.free[home * width], now)
    return lq < lh or (lq == lh and (fq < fh or (fq == fh and st.rank[q] < st.rank[home])))


@njit(cache=True, inline="always")
def _least_busy(st, i, now) -> int:
    """Of the regions that take prompts and can hold request ``i``, the one with the shortest
    queue, then the pipeline free soonest, then the first by name."""
    home = -1
    for q in range(st.params[REGIONS]):
        if st.role[q] == DECODE or _holds(st, q, i) > st.cap[q]:
            continue
        if home < 0 or _less_busy(st, q, home, now):
            home = q
    return home


@njit(cache=True)
def _prefix_home(st, i, now) -> int:
    """Of the regions that take prompts and can hold block-trace request ``i``, the one whose
    cache holds most of its leading blocks (the least busy of those that tie), or -1 when
    none holds any."""
    if not st.params[CACHING] or st.params[BLOCK_TOKENS] == 0:
        return -1
    home, most = -1, 0
    sessions = st.params[SESSIONS]
    for q in range(st.params[REGIONS]):
        if st.role[q] == DECODE or _holds(st, q, i) > st.cap[q]:
            continue
        hits = 0
        for k in range(st.block_at[i], st.block_at[i + 1]):
            if st.c_call[q * sessions + st.blocks[k]] < 0:
                break
            hits += 1
        if hits > most or (hits == most and hits > 0 and _less_busy(st, q, home, now)):
            home, most = q, hits
    return home


@njit(cache=True, inline="always")
def _in_turn(st, i) -> int:
    """The next region in turn that takes prompts and can hold request ``i`` (-1: none)."""
    n = st.params[REGIONS]
    for k in range(n):
        q = (st.params[IN_TURN] + k) % n
        if st.role[q] != DECODE and _holds(st, q, i) <= st.cap[q]:
            st.params[IN_TURN] = q + 1
            return q
    return -1


@njit(cache=True, inline="always")
def _on_dispatch(st, now, r, mixed, prefill, decode) -> None:
    """``plain.Dispatch``: region ``r``'s policy starts its next micro-batch, if stage 0 is
    free (else the dispatch is due again when it is); another dispatch follows once stage 0
    frees, while anything waits."""
    free0 = st.free[r * st.params[WIDTH]]
    st.dispatching[r] = 0  # this was the region's one dispatch in the heap
    if now < free0:
        st.dispatching[r] = 1
        _schedule(st, free0, DISPATCH_EVENT, r, 0, 0)
        return
    went = _dispatch(st, r, now, mixed, prefill, decode)
    if went and (st.pq_len[r] > 0 or st.rq_len[r] > 0):
        st.dispatching[r] = 1
        _schedule(st, st.free[r * st.params[WIDTH]], DISPATCH_EVENT, r, 0, 0)
    # else nothing waits: the next arrival or returning sequence kicks it


@njit(cache=True, inline="always")
def _dispatch(st, r, now, mixed, prefill, decode) -> bool:
    """The dispatch of region ``r``'s role (``mixed``, ``prefill`` or ``decode``), with the
    role's knobs."""
    role = st.role[r]
    if role == MIXED:
        return mixed(st, r, now, st.knobs_mixed)
    if role == PREFILL:
        return prefill(st, r, now, st.knobs_prefill)
    return decode(st, r, now, st.knobs_decode)


@njit(cache=True, inline="always")
def _on_decoded(st, now, r, size) -> None:
    """``plain.Decoded``: the ``size`` sequences at the head of region ``r``'s in-flight list
    have one more token each (verified with speculation, and the drafted ones accepted
    before it); those done leave, the others are ready for the next."""
    st.in_flight[r] -= size
    for _ in range(size):
        i = st.fq_head[r]
        st.fq_head[r] = st.nxt[i]
        tokens = 1
        if st.drafts[r] > 0:
            tokens = min(1 + min(st.runs[st.run_at[i]], st.drafts[r]),
                         st.output[i] - st.made[i])
            st.run_at[i] += 1
        for _ in range(tokens):  # the gap before the first; the others come with it
            _token_out(st, i, now)
        st.decoded[r] += tokens
        if st.made[i] >= st.output[i]:
            # A colocated region caches the whole context but the newest token, whose KV
            # was never made; a decode region caches nothing.
            _finish(st, r, i, now, st.need[i], st.need[i] - 1 if st.role[r] == MIXED else 0)
        else:
            _make_ready(st, r, i, st.ctx[i] + tokens, now)
    if st.hq_len[0] > 0:
        _start_handoffs(st, now)  # KV room may have been freed
    _kick(st, r, now)


@njit(cache=True, inline="always")
def _token_out(st, i, now) -> None:
    """Request ``i``'s next token is out: the gap since its previous one is noted."""
    st.made[i] += 1
    g = st.counts[GAPS]
    st.gap_req[g] = i
    st.gap_cyc[g] = now - st.last[i]
    st.counts[GAPS] = g + 1
    st.last[i] = now


@njit(cache=True, inline="always")
def _on_prefilled(st, now, i, r) -> None:
    """``plain.Prefilled``: prompt ``i``'s last tile left region ``r``'s last stage, and its
    first token is out. It decodes where it is, if the region is colocated; else its KV moves
    to a decode region once one has room."""
    st.first[i] = now
    st.last[i] = now
    st.made[i] = 1
    if st.made[i] >= st.output[i]:
        _finish(st, r, i, now, _holds(st, r, i), st.prompt[i])
        _kick(st, r, now)
    elif st.role[r] == MIXED:
        _make_ready(st, r, i, st.prompt[i] + 1, now)
        st.where[i] = r
        _kick(st, r, now)
    else:
        st.hsrc[i] = r
        _enqueue(st.hnext, st.hq_head, st.hq_tail, st.hq_len, 0, i)
        _start_handoffs(st, now)


@njit(cache=True, inline="always")
def _on_joined(st, now, i, q, src) -> None:
    """``plain.Joined``: request ``i``'s KV arrived in decode region ``q`` from ``src``, which
    gives it up; it is ready there for its next token."""
    _release(st, src, i, st.prompt[i], st.prompt[i], now)  # the transfer is done
    _kick(st, src, now)
    st.where[i] = q
    _make_ready(st, q, i, st.prompt[i] + 1, now)
    _kick(st, q, now)


# --- the event heap (time, then sequence number) ---------------------------------------------
# ``heap``: the times, the sequence numbers and the events (kind and three numbers each) of
# the events due, a binary heap over its first ``n``.

@njit(cache=True, inline="always")
def _before(t1, s1, t2, s2) -> bool:
    return t1 < t2 or (t1 == t2 and s1 < s2)


@njit(cache=True, inline="always")
def _push(heap, n, t, s, event) -> None:
    """Add ``event`` (kind and three numbers), due at ``t`` with sequence number ``s``."""
    ht, hs, hd = heap
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
    hd[4 * k], hd[4 * k + 1], hd[4 * k + 2], hd[4 * k + 3] = event


@njit(cache=True, inline="always")
def _pop(heap, n):
    """Remove the first of ``n`` events; returns its time and the event."""
    ht, hs, hd = heap
    first = ht[0], (hd[0], hd[1], hd[2], hd[3])
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
    return first


@njit(cache=True, inline="always")
def _scheduled(st, e):
    """The ``e``-th event the handled event scheduled (kind and three numbers)."""
    return st.out_d[4 * e], st.out_d[4 * e + 1], st.out_d[4 * e + 2], st.out_d[4 * e + 3]


# --- the loop ---------------------------------------------------------------------------------

def _loop(arrays, mixed, prefill, decode):
    """Serve every request; returns the number of events handled, or -1 if the heap ran out
    of room (``params[HEAP]``). ``mixed``, ``prefill``, ``decode``: each role's compiled
    dispatch, each a function of its own (a tuple of them would be typed afresh at every
    call, with a warning that first-class functions are experimental)."""
    st = _state_of(arrays)
    heap = (st.ht, st.hs, st.hd)
    ht, hs = st.ht, st.hs
    stream_t, stream_seq = st.stream_t, st.stream_seq
    first_calls, room = st.params[FIRST_CALLS], st.params[HEAP]
    n = ap = handled = 0  # events in the heap; first calls taken from the stream
    seq = first_calls  # the first calls took the numbers before
    at_once = False  # the event scheduled last is the next, without the heap
    now, event = 0.0, (0, 0, 0, 0)
    while True:
        # The next event: the next first call's arrival, unless the heap's first comes before.
        if at_once:
            at_once = False
        elif ap < first_calls and (n == 0 or _before(stream_t[ap], stream_seq[ap], ht[0],
                                                      hs[0])):
            now, event = stream_t[ap], (ARRIVE, st.stream_req[ap], 0, 0)
            ap += 1
        elif n > 0:
            now, event = _pop(heap, n)
            n -= 1
        else:
            return handled
        handled += 1
        st.counts[OUT] = 0
        kind, a, b, c = event
        if kind == DECODED:
            _on_decoded(st, now, a, b)
        elif kind == ARRIVE:
            _on_arrival(st, now, a)
        elif kind == DISPATCH_EVENT:
            _on_dispatch(st, now, a, mixed, prefill, decode)
        elif kind == PREFILLED:
            _on_prefilled(st, now, a, b)
        elif kind == RESTORED:
            _on_restored(st, now, a, b)
        else:
            _on_joined(st, now, a, b, c)
        scheduled = st.counts[OUT]
        if scheduled == 1 and (n == 0 or st.out_t[0] < ht[0]) and (
                ap >= first_calls or st.out_t[0] < stream_t[ap]):
            at_once = True
            now, event = st.out_t[0], _scheduled(st, 0)
            seq += 1
            continue
        if n + scheduled > room:
            return -1
        for e in range(scheduled):
            _push(heap, n, st.out_t[e], seq, _scheduled(st, e))
            n += 1
            seq += 1


_LOOP_SIGNATURE = types.int64(ARRAYS, DISPATCH_FUNCTION, DISPATCH_FUNCTION, DISPATCH_FUNCTION)
_compiled: dict = {}
# Loading from Numba's cache takes under a second; compiling (once after install, or after
# this file or a policy's dispatch changed) takes long, and says so (``progress.slow``).
COMPILING = "compiling the serving loop (once after install: up to a minute; cached after)"


# The primitives a dispatch calls as functions of their own, each compiled once at the one
# signature every dispatch calls it with; the small ones are inlined. Inlined, these three
# were compiled again into every dispatch, and a call passing a constant (``send(st, r, now,
# 0, i, n)``) made Numba compile a copy for that constant: compiling the three policies'
# dispatches with nothing cached took five minutes.
_CALLED = ((admit, types.boolean(STATE, types.int64, types.int64, types.float64)),
           (send, types.none(STATE, types.int64, types.float64, types.int64, types.int64,
                             types.int64)),
           (send_decode, types.boolean(STATE, types.int64, types.float64, types.int64)))


def _compile_called() -> None:
    """``_CALLED`` compiled (or loaded from Numba's cache) at their signatures, and kept to
    them: a call with constants converts them rather than compiling another copy."""
    for function, signature in _CALLED:
        if signature.args not in function.signatures:
            function.compile(signature)
            function.disable_compile()


def compile_dispatch(function):
    """``function`` (a policy's dispatch, in the form numba compiles) compiled with the
    signature ``DISPATCH`` and cached, once per process."""
    if function not in _compiled:
        with slow(COMPILING):  # said only if it takes long: Numba's cache did not hold it
            _compile_called()
            _compiled[function] = njit(DISPATCH, cache=True)(function)
    return _compiled[function]


def compiled_loop():
    """The loop compiled with the signature ``_LOOP_SIGNATURE`` and cached, once per
    process."""
    if "loop" not in _compiled:
        with slow(COMPILING):
            _compiled["loop"] = njit(_LOOP_SIGNATURE, cache=True)(_loop)
    return _compiled["loop"]


def run_loop(arrays: LoopArrays, dispatch: tuple) -> int:
    """Run the compiled loop on ``arrays`` (changed in place) with the roles' dispatch
    functions (mixed, prefill, decode: compiled by ``compile_dispatch``)."""
    return compiled_loop()(arrays, *dispatch)
