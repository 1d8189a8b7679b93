"""The cycle engine: wavelet-level, cycle by cycle.

Every router has five input ports (N, E, S, W and the ramp from its PE) and five outputs. Each
input port has one queue per virtual channel (color) of ``queue_wavelets`` entries; colors share
the physical link, which carries one wavelet per cycle per direction. A wavelet may leave only
when the queue it goes to has room (credits, returned one cycle after the wavelet moves on), so
none is ever dropped. A link delivers after ``hop`` cycles, a ramp after ``ramp`` cycles.

One cycle, in order: wavelets reach PEs (feeding the tasks that wait for them); tasks start and
finish (as in ``taskgraph``; finished ones queue their messages to send), and external messages
whose time has come queue too; wavelets arrive from links and ramps; every router moves at most
one wavelet per input port and one per output port (input ports tried round-robin starting at
``(cycle + router) % 5``, colors round-robin per port); every PE injects at most one wavelet;
freed credits return. A line multicast moves only when all the outputs it needs (the next hop
and the local ramp) are free at once.

Zero-load latency of an M-wavelet message over H hops is H*hop + 2*ramp + (M - 1) cycles from
the cycle it may start to the cycle its last wavelet reaches the PE.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from wse_emu.engines.cores import (
    ID_BITS,
    core_event,
    feed,
    new_cores,
    pop,
    push,
    ready_key,
)
from wse_emu.engines.messages import LINE, PORTS, RAMP, Messages
from wse_emu.engines.taskgraph import TaskGraph


@dataclass
class CycleResult:
    cycles: int  # cycles simulated
    task_start: np.ndarray
    task_end: np.ndarray
    t_first: np.ndarray  # per message: cycle its first wavelet was injected (-1: never)
    t_done: np.ndarray  # per message: cycle its last wavelet reached its last point (-1: not)
    point_done: np.ndarray  # per delivery point: cycle it had all wavelets (-1: not yet)
    point_base: np.ndarray  # per message: index of its first delivery point
    link_wavelets: np.ndarray  # (routers, 4): wavelets sent per output direction N, E, S, W
    injected: int
    delivered: int
    in_flight_cycles: int  # sum over cycles of wavelets in flight (for Little's law)
    violation_cycle: int  # first cycle where injected + copies != delivered + in flight


def run(width: int, height: int, vcs: int, queue_wavelets: int, hop: int, ramp: int,
        messages: Messages, max_cycles: int, check: bool = False) -> CycleResult:
    """Simulate ``messages`` (sorted by ``t_ready``) until all are delivered or ``max_cycles``."""
    messages.validate(width, height, vcs)
    empty = np.zeros(0, dtype=np.int64)
    graph = TaskGraph(width, height, empty, empty, empty, empty, np.zeros(1, np.int64), empty,
                      np.zeros(1, np.int64), empty, messages,
                      np.full(int(messages.points(width).sum()), -1, dtype=np.int64))
    return run_graph(graph, vcs, queue_wavelets, hop, ramp, max_cycles, check)


def run_graph(graph: TaskGraph, vcs: int, queue_wavelets: int, hop: int, ramp: int,
              max_cycles: int, check: bool = False) -> CycleResult:
    """Execute a task graph; messages use virtual channel ``vc % vcs``."""
    if hop < 1 or ramp < 1:
        raise ValueError("the cycle engine needs hop and ramp latency of at least one cycle")
    graph.check_ranges()
    msgs = graph.msgs
    base = graph.point_base()
    external = np.flatnonzero(msgs.t_ready >= 0)
    external = external[np.argsort(msgs.t_ready[external], kind="stable")]
    out = _simulate(graph.width, graph.height, vcs, queue_wavelets, hop, ramp, msgs.t_ready,
                    msgs.src, msgs.dst, msgs.length, msgs.mode, msgs.vc % vcs, base,
                    external, graph.task_pe, graph.task_priority, graph.task_cycles,
                    graph.task_need, graph.out_ptr,
                    graph.out_msg, graph.succ_ptr, graph.succ_task, graph.msg_target,
                    max_cycles, check)
    (cycles, start, end, t_first, t_done, point_done, links, injected, delivered, occupancy,
     violation) = out
    return CycleResult(int(cycles), start, end, t_first, t_done, point_done, base[:-1], links,
                       int(injected), int(delivered), int(occupancy), int(violation))


@njit(cache=True)
def _xy_port(x, y, dx, dy):
    """Dimension-ordered routing: x first, then y; RAMP at the destination."""
    if dx > x:
        return 1  # EAST
    if dx < x:
        return 3  # WEST
    if dy > y:
        return 2  # SOUTH
    if dy < y:
        return 0  # NORTH
    return RAMP


@njit(cache=True)
def _neighbour(r, direction, width):
    if direction == 0:
        return r - width
    if direction == 1:
        return r + 1
    if direction == 2:
        return r + width
    return r - 1


@njit(cache=True)
def _queue_send(m, src, pe_head, pe_tail, nxt, senders, n_senders):
    """Message ``m`` joins the end of its PE's send queue; returns the number of senders."""
    s = src[m]
    if pe_tail[s] < 0:
        pe_head[s] = m
        senders[n_senders] = s
        n_senders += 1
    else:
        nxt[pe_tail[s]] = m
    pe_tail[s] = m
    return n_senders


# A queued wavelet is one int64: its message id (low 32 bits) and what routing needs, so that
# a router never looks the message up: destination x (15 bits), y (15 bits), line flag.
_MSG_MASK = (1 << 32) - 1


@njit(cache=True)
def _pack(m, dx, dy, line):
    return m | (dx << 32) | (dy << 47) | (line << 62)


# Per-router scalars packed in one 64-byte row (one cache line): per input port a bit mask of
# its non-empty color queues, the total of queued wavelets, the active flag, the arbitration
# start port, color round-robin pointers, x, y.
_POCC, _ROCC, _ACT, _START, _VRR, _X, _Y, _RINFO = 0, 5, 6, 7, 8, 13, 14, 16


@njit(cache=True)
def _simulate(width, height, vcs, qcap, hop, ramp, t_ready, src, dst, length, mode, vc,
              point_base, external, task_pe, task_priority, task_cycles, task_need, out_ptr,
              out_msg, succ_ptr, succ_task, msg_target, max_cycles, check):
    n = width * height
    m_count = len(src)
    opposite = np.array([2, 3, 0, 1], dtype=np.int64)
    rinfo = np.zeros((n, _RINFO), dtype=np.int32)
    for r in range(n):
        rinfo[r, _START] = r % PORTS
        rinfo[r, _X] = r % width
        rinfo[r, _Y] = r // width
    mdx = np.empty(m_count, dtype=np.int32)
    mdy = np.empty(m_count, dtype=np.int32)
    msx = np.empty(m_count, dtype=np.int32)
    msy = np.empty(m_count, dtype=np.int32)
    for m in range(m_count):
        mdx[m] = dst[m] % width
        mdy[m] = dst[m] // width
        msx[m] = src[m] % width
        msy[m] = src[m] // width
    qbuf = np.zeros((n, PORTS, vcs, qcap), dtype=np.int64)
    qinfo = np.zeros((n, PORTS, vcs, 2), dtype=np.int32)  # head, length
    cred = np.full((n, PORTS, vcs), qcap, dtype=np.int32)  # port RAMP: the PE's injection
    ret_r = np.zeros(n * PORTS, dtype=np.int64)
    ret_d = np.zeros(n * PORTS, dtype=np.int64)
    ret_v = np.zeros(n * PORTS, dtype=np.int64)

    # Wavelets on links and ramps, as lists per arrival slot (cycle modulo the latency).
    l_r = np.zeros((hop, 4 * n), dtype=np.int64)
    l_d = np.zeros((hop, 4 * n), dtype=np.int64)
    l_m = np.zeros((hop, 4 * n), dtype=np.int64)
    l_v = np.zeros((hop, 4 * n), dtype=np.int64)
    l_n = np.zeros(hop, dtype=np.int64)
    i_r = np.zeros((ramp, n), dtype=np.int64)
    i_m = np.zeros((ramp, n), dtype=np.int64)
    i_n = np.zeros(ramp, dtype=np.int64)
    o_r = np.zeros((ramp, n), dtype=np.int64)
    o_m = np.zeros((ramp, n), dtype=np.int64)
    o_n = np.zeros(ramp, dtype=np.int64)

    # Send queues: per PE a linked list of released messages; PEs with one are listed.
    pe_head = np.full(n, -1, dtype=np.int64)
    pe_tail = np.full(n, -1, dtype=np.int64)
    nxt = np.full(m_count, -1, dtype=np.int64)
    sent = np.zeros(m_count, dtype=np.int64)
    senders = np.zeros(n, dtype=np.int64)
    n_senders = 0
    active = np.zeros(n, dtype=np.int64)  # routers with queued wavelets
    n_active = 0

    total_points = point_base[m_count]
    point_count = np.zeros(total_points, dtype=np.int64)
    point_done = np.full(total_points, -1, dtype=np.int64)
    points_left = np.zeros(m_count, dtype=np.int64)
    for m in range(m_count):
        points_left[m] = point_base[m + 1] - point_base[m]
    t_first = np.full(m_count, -1, dtype=np.int64)
    t_done = np.full(m_count, -1, dtype=np.int64)
    links = np.zeros((n, 4), dtype=np.int64)

    # Tasks: an event heap of (cycle, kind, task), as in the fast engine.
    n_tasks = len(task_pe)
    need = task_need.copy()
    start_t = np.full(n_tasks, -1, dtype=np.int64)
    end_t = np.full(n_tasks, -1, dtype=np.int64)
    q_base, qa, qb, q_count, running, dispatch_due = new_cores(n, task_pe)
    busy = np.zeros(n, dtype=np.int64)
    ht = np.empty(1024 + 2 * n_tasks, dtype=np.int64)
    hk = np.empty(1024 + 2 * n_tasks, dtype=np.int64)
    hsize = 0
    for k in range(n_tasks):
        if need[k] == 0:
            hsize = push(ht, hk, hsize, 0, ready_key(task_priority[k], k))
    tasks_done = 0

    released = 0
    finished = 0
    injected = 0
    delivered = 0
    copies = 0
    occupancy = 0
    queued = 0
    violation = -1
    t = 0
    while t < max_cycles and (finished < m_count or tasks_done < n_tasks):
        # 1. Arrivals at PEs: a delivery point with all its wavelets may make a task ready.
        rs = t % ramp
        ls = t % hop
        for i in range(o_n[rs]):
            r = o_r[rs, i]
            m = o_m[rs, i]
            delivered += 1
            dist = abs(rinfo[r, _X] - msx[m]) + abs(rinfo[r, _Y] - msy[m])
            idx = point_base[m] + (dist - 1 if mode[m] == LINE and dist > 0 else 0)
            point_count[idx] += 1
            if point_count[idx] == length[m]:
                point_done[idx] = t
                ht, hk, hsize = feed(msg_target[idx], t, need, task_priority, ht, hk, hsize)
                points_left[m] -= 1
                if points_left[m] == 0:
                    t_done[m] = t
                    finished += 1
        o_n[rs] = 0

        # 2. Tasks: ready ones claim their PE's core, finished ones send their messages.
        #    External messages whose time has come join their PE's send queue too.
        while hsize > 0 and ht[0] <= t:
            _, key, hsize = pop(ht, hk, hsize)
            ht, hk, hsize, finished = core_event(
                key >> ID_BITS, key & ((1 << ID_BITS) - 1), t, ht, hk, hsize, task_pe,
                task_priority, task_cycles, succ_ptr, succ_task, need, start_t, end_t, busy,
                q_base, qa, qb, q_count, running, dispatch_due)
            if finished >= 0:
                tasks_done += 1
                for i in range(out_ptr[finished], out_ptr[finished + 1]):
                    n_senders = _queue_send(out_msg[i], src, pe_head, pe_tail, nxt, senders,
                                            n_senders)
        while released < len(external) and t_ready[external[released]] <= t:
            n_senders = _queue_send(external[released], src, pe_head, pe_tail, nxt, senders,
                                    n_senders)
            released += 1

        # 3. Arrivals from links and ramps into router queues.
        for i in range(l_n[ls] + i_n[rs]):
            if i < l_n[ls]:
                nb = _neighbour(l_r[ls, i], l_d[ls, i], width)
                p = opposite[l_d[ls, i]]
                e = l_m[ls, i]
                v = l_v[ls, i]
            else:
                nb = i_r[rs, i - l_n[ls]]
                p = RAMP
                m = i_m[rs, i - l_n[ls]]
                e = _pack(m, mdx[m], mdy[m], 1 if mode[m] == LINE else 0)
                v = vc[m]
            pos = qinfo[nb, p, v, 0] + qinfo[nb, p, v, 1]
            if pos >= qcap:
                pos -= qcap
            qbuf[nb, p, v, pos] = e
            qinfo[nb, p, v, 1] += 1
            rinfo[nb, p] |= 1 << v
            rinfo[nb, _ROCC] += 1
            queued += 1
            if rinfo[nb, _ACT] == 0:
                rinfo[nb, _ACT] = 1
                active[n_active] = nb
                n_active += 1
        l_n[ls] = 0
        i_n[rs] = 0

        # 4. Switch: one wavelet per input port and per output port.
        nret = 0
        keep = 0
        t_port = t % PORTS
        for a in range(n_active):
            r = active[a]
            rx = rinfo[r, _X]
            ry = rinfo[r, _Y]
            used = 0  # bit mask of output ports taken this cycle
            start = rinfo[r, _START] + t_port
            if start >= PORTS:
                start -= PORTS
            for k in range(PORTS):
                p = start + k
                if p >= PORTS:
                    p -= PORTS
                if rinfo[r, p] == 0:
                    continue
                for j in range(vcs):
                    v = rinfo[r, _VRR + p] + j
                    if v >= vcs:
                        v -= vcs
                    if (rinfo[r, p] >> v) & 1 == 0:
                        continue
                    e = qbuf[r, p, v, qinfo[r, p, v, 0]]
                    out = _xy_port(rx, ry, (e >> 32) & 0x7FFF, (e >> 47) & 0x7FFF)
                    # A line multicast taps the ramp at every router after its source (where
                    # it entered from the ramp).
                    tap = (e >> 62) & 1 == 1 and out != RAMP and p != RAMP
                    if used & (1 << out):
                        continue
                    if out < 4 and cred[r, out, v] == 0:
                        continue
                    if tap and used & (1 << RAMP):
                        continue
                    # Granted.
                    h = qinfo[r, p, v, 0] + 1
                    qinfo[r, p, v, 0] = 0 if h == qcap else h
                    qinfo[r, p, v, 1] -= 1
                    if qinfo[r, p, v, 1] == 0:
                        rinfo[r, p] &= ~(1 << v)
                    rinfo[r, _ROCC] -= 1
                    queued -= 1
                    rinfo[r, _VRR + p] = 0 if v + 1 == vcs else v + 1
                    if p < 4:
                        ret_r[nret] = _neighbour(r, p, width)
                        ret_d[nret] = opposite[p]
                    else:
                        ret_r[nret] = r
                        ret_d[nret] = RAMP
                    ret_v[nret] = v
                    nret += 1
                    used |= 1 << out
                    if out < 4:
                        c = l_n[ls]
                        l_r[ls, c] = r
                        l_d[ls, c] = out
                        l_m[ls, c] = e
                        l_v[ls, c] = v
                        l_n[ls] = c + 1
                        cred[r, out, v] -= 1
                        links[r, out] += 1
                    if out == RAMP or tap:
                        c = o_n[rs]
                        o_r[rs, c] = r
                        o_m[rs, c] = e & _MSG_MASK
                        o_n[rs] = c + 1
                        if tap:
                            used |= 1 << RAMP
                            copies += 1
                    break
            if rinfo[r, _ROCC] > 0:
                active[keep] = r
                keep += 1
            else:
                rinfo[r, _ACT] = 0
        n_active = keep

        # 5. Each PE injects at most one wavelet of the message at the head of its queue.
        keep = 0
        for a in range(n_senders):
            s = senders[a]
            m = pe_head[s]
            v = vc[m]
            if cred[s, RAMP, v] > 0:
                cred[s, RAMP, v] -= 1
                c = i_n[rs]
                i_r[rs, c] = s
                i_m[rs, c] = m
                i_n[rs] = c + 1
                injected += 1
                if sent[m] == 0:
                    t_first[m] = t
                sent[m] += 1
                if sent[m] == length[m]:
                    pe_head[s] = nxt[m]
                    if pe_head[s] < 0:
                        pe_tail[s] = -1
            if pe_head[s] >= 0:
                senders[keep] = s
                keep += 1
        n_senders = keep

        # 6. Credits freed this cycle become usable next cycle.
        for i in range(nret):
            cred[ret_r[i], ret_d[i], ret_v[i]] += 1

        flight = injected + copies - delivered
        occupancy += flight
        if check and violation < 0:
            counted = queued
            for i in range(hop):
                counted += l_n[i]
            for i in range(ramp):
                counted += i_n[i] + o_n[i]
            recount = 0
            for r in range(n):
                recount += rinfo[r, _ROCC]
            if counted != flight or flight < 0 or recount != queued:
                violation = t
        t += 1
    return (t, start_t, end_t, t_first, t_done, point_done, links, injected, delivered,
            occupancy, violation)
