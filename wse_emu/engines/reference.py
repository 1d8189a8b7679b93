"""Slow, plain-Python twins of the jitted engines, written for clarity, not speed.

Tests run both on tiny meshes and require identical results. The twin follows the cycle
engine's documented rules literally, with dictionaries and deques instead of packed arrays.
"""

from __future__ import annotations

import heapq
from collections import deque

import numpy as np

from wse_emu.engines.messages import LINE, RAMP, Messages
from wse_emu.engines.taskgraph import TaskGraph

DELIVERY, RELEASE, DONE, READY, DISPATCH = 0, 1, 2, 3, 4


class Cores:
    """Each PE's core: one task at a time, the ready task with the smallest (priority, ready
    cycle, id) next."""

    def __init__(self, graph: TaskGraph):
        self.graph = graph
        self.ready = {}  # pe -> heap of (priority, ready cycle, task)
        self.running = {}
        self.due = set()

    def ready_event(self, task, now):
        """READY events at one cycle are taken best first: (priority, task id)."""
        return (now, READY, int(self.graph.task_priority[task]), task)

    def make_ready(self, task, now, events, start):
        p = int(self.graph.task_pe[task])
        if self.running.get(p) is None and not self.ready.get(p) and p not in self.due:
            self.run(p, task, now, events, start)
            return
        heapq.heappush(self.ready.setdefault(p, []),
                       (int(self.graph.task_priority[task]), now, task))

    def run(self, p, task, now, events, start):
        self.running[p] = task
        start[task] = now
        heapq.heappush(events, (now + int(self.graph.task_cycles[task]), DONE, 0, task))

    def dispatch(self, p, now, events, start):
        self.due.discard(p)
        if self.running.get(p) is None and self.ready.get(p):
            _, _, task = heapq.heappop(self.ready[p])
            self.run(p, task, now, events, start)

    def finish(self, task, now, events):
        p = int(self.graph.task_pe[task])
        self.running[p] = None
        if self.ready.get(p) and p not in self.due:
            self.due.add(p)
            heapq.heappush(events, (now, DISPATCH, 0, p))

DIRS = {0: (0, -1), 1: (1, 0), 2: (0, 1), 3: (-1, 0)}  # N, E, S, W as (dx, dy)
OPPOSITE = {0: 2, 1: 3, 2: 0, 3: 1}


def xy_next(x, y, dx, dy):
    if dx > x:
        return 1
    if dx < x:
        return 3
    if dy > y:
        return 2
    if dy < y:
        return 0
    return RAMP


def cycle_twin(width, height, vcs, qcap, hop, ramp, msgs: Messages, max_cycles,
               graph: TaskGraph | None = None):
    """Returns (cycles, t_first, t_done, point_done list per message, link counts dict,
    task start, task end)."""
    n = width * height
    tasks = graph.tasks if graph is not None else 0
    need = list(graph.task_need) if graph is not None else []
    start_t, end_t = [-1] * tasks, [-1] * tasks
    cores = Cores(graph) if graph is not None else None
    events = [cores.ready_event(k, 0) for k in range(tasks) if need[k] == 0] if cores else []
    heapq.heapify(events)
    targets = []
    if graph is not None:
        base = graph.point_base()
        targets = [list(graph.msg_target[base[m]:base[m + 1]]) for m in range(len(msgs))]
    coords = [(r % width, r // width) for r in range(n)]
    queues = {(r, p, v): deque() for r in range(n) for p in range(5) for v in range(vcs)}
    credits = {(r, p, v): qcap for r in range(n) for p in range(5) for v in range(vcs)}
    vc_pointer = {(r, p): 0 for r in range(n) for p in range(5)}
    in_transit = []  # (arrival cycle, kind, router, port or None, message, vc)
    send_queue = {r: deque() for r in range(n)}
    sent = [0] * len(msgs)
    t_first = [-1] * len(msgs)
    points = msgs.points(width)
    got = [[0] * int(points[m]) for m in range(len(msgs))]
    point_done = [[-1] * int(points[m]) for m in range(len(msgs))]
    t_done = [-1] * len(msgs)
    links = {}
    order = [m for m in range(len(msgs)) if msgs.t_ready[m] >= 0]
    order.sort(key=lambda m: msgs.t_ready[m])
    released = 0
    finished = 0
    t = 0
    while t < max_cycles and (finished < len(msgs) or sum(e >= 0 for e in end_t) < tasks):
        arriving = [w for w in in_transit if w[0] == t]
        in_transit = [w for w in in_transit if w[0] != t]
        for _, kind, r, port, m, v in arriving:
            if kind == "eject":
                sx, sy = coords[int(msgs.src[m])]
                x, y = coords[r]
                dist = abs(x - sx) + abs(y - sy)
                idx = dist - 1 if msgs.mode[m] == LINE and dist > 0 else 0
                got[m][idx] += 1
                if got[m][idx] == msgs.length[m]:
                    point_done[m][idx] = t
                    if targets and targets[m][idx] >= 0:
                        need[targets[m][idx]] -= 1
                        if need[targets[m][idx]] == 0:
                            heapq.heappush(events, cores.ready_event(targets[m][idx], t))
                    if all(d >= 0 for d in point_done[m]):
                        t_done[m] = t
                        finished += 1
        while events and events[0][0] <= t:
            _, kind, _, k = heapq.heappop(events)
            if kind == READY:
                cores.make_ready(k, t, events, start_t)
            elif kind == DISPATCH:
                cores.dispatch(k, t, events, start_t)
            else:
                end_t[k] = t
                cores.finish(k, t, events)
                for nx in graph.succ_task[graph.succ_ptr[k]:graph.succ_ptr[k + 1]]:
                    need[nx] -= 1
                    if need[nx] == 0:
                        heapq.heappush(events, cores.ready_event(int(nx), t))
                for m in graph.out_msg[graph.out_ptr[k]:graph.out_ptr[k + 1]]:
                    send_queue[int(msgs.src[m])].append(int(m))
        while released < len(order) and msgs.t_ready[order[released]] <= t:
            m = order[released]
            send_queue[int(msgs.src[m])].append(m)
            released += 1
        for _, kind, r, port, m, v in arriving:
            if kind != "eject":
                queues[(r, port, v)].append(m)
        returns = []
        for r in range(n):
            x, y = coords[r]
            used = set()
            start = (t + r) % 5
            for k in range(5):
                p = (start + k) % 5
                for j in range(vcs):
                    v = (vc_pointer[(r, p)] + j) % vcs
                    q = queues[(r, p, v)]
                    if not q:
                        continue
                    m = q[0]
                    dx, dy = coords[int(msgs.dst[m])]
                    out = xy_next(x, y, dx, dy)
                    tap = msgs.mode[m] == LINE and out != RAMP and p != RAMP
                    if out in used or (out < 4 and credits[(r, out, v)] == 0):
                        continue
                    if tap and RAMP in used:
                        continue
                    q.popleft()
                    vc_pointer[(r, p)] = (v + 1) % vcs
                    if p < 4:
                        ddx, ddy = DIRS[p]
                        upstream = (y + ddy) * width + (x + ddx)
                        returns.append((upstream, OPPOSITE[p], v))
                    else:
                        returns.append((r, RAMP, v))
                    used.add(out)
                    if out < 4:
                        ddx, ddy = DIRS[out]
                        nb = (y + ddy) * width + (x + ddx)
                        in_transit.append((t + hop, "link", nb, OPPOSITE[out], m, v))
                        credits[(r, out, v)] -= 1
                        links[(r, out)] = links.get((r, out), 0) + 1
                    if out == RAMP or tap:
                        used.add(RAMP)
                        in_transit.append((t + ramp, "eject", r, None, m, v))
                    break
        for s in range(n):
            if not send_queue[s]:
                continue
            m = send_queue[s][0]
            v = int(msgs.vc[m])
            if credits[(s, RAMP, v)] > 0:
                credits[(s, RAMP, v)] -= 1
                in_transit.append((t + ramp, "inject", s, RAMP, m, v))
                if sent[m] == 0:
                    t_first[m] = t
                sent[m] += 1
                if sent[m] == msgs.length[m]:
                    send_queue[s].popleft()
        for key in returns:
            credits[key] += 1
        t += 1
    return t, np.array(t_first), np.array(t_done), point_done, links, start_t, end_t


def fast_twin(graph: TaskGraph, hop: int, ramp: int, qcap: int = 8):
    """The fast engine's rules, literally: returns (task start, task end, point done, wavelets
    per link as {(router, direction): count})."""
    width = graph.width
    msgs = graph.msgs
    base = graph.point_base()
    need = list(graph.task_need)
    start, end = [-1] * graph.tasks, [-1] * graph.tasks
    point_done = [-1] * len(graph.msg_target)
    ramp_in, ramp_out, link_free, links = {}, {}, {}, {}
    cores = Cores(graph)
    events = [cores.ready_event(k, 0) for k in range(graph.tasks) if need[k] == 0]
    events += [(int(msgs.t_ready[m]), RELEASE, 0, m) for m in range(len(msgs))
               if msgs.t_ready[m] >= 0]
    heapq.heapify(events)

    def send(m, now):
        s, d, length = int(msgs.src[m]), int(msgs.dst[m]), int(msgs.length[m])
        inj = max(now, ramp_in.get(s, 0))
        ramp_in[s] = inj + length
        head = inj + ramp
        x, y = s % width, s // width
        dx, dy = d % width, d // width
        path = [(x, y)]
        while (x, y) != (dx, dy):
            step = xy_next(x, y, dx, dy)
            x, y = x + DIRS[step][0], y + DIRS[step][1]
            path.append((x, y))
        if len(path) == 1:
            e = max(head, ramp_out.get(s, 0))
            ramp_out[s] = e + length
            heapq.heappush(events, (e + ramp + length - 1, DELIVERY, 0, int(base[m])))
            return
        point = 0
        claimed = []
        for (ax, ay), (bx, by) in zip(path, path[1:]):
            direction = xy_next(ax, ay, bx, by)
            key = (ay * width + ax, direction)
            t = max(head, link_free.get(key, 0))
            link_free[key] = t + length
            links[key] = links.get(key, 0) + length
            claimed.append((key, t))
            head = t + hop
            r = by * width + bx
            if msgs.mode[m] == LINE or r == d:
                e = max(head, ramp_out.get(r, 0))
                ramp_out[r] = e + length
                heapq.heappush(events, (e + ramp + length - 1, DELIVERY, 0,
                                        int(base[m]) + point))
                point += 1
                head = e  # the multicast waits for its tap
        # Each link stays held until the tail ahead of it leaves, less the queue in between.
        hold = claimed[-1][1] + length
        for key, _ in reversed(claimed[:-1]):
            hold = max(hold - hop - qcap, link_free[key])
            link_free[key] = hold

    while events:
        now, kind, _, ident = heapq.heappop(events)
        if kind == READY:
            cores.make_ready(ident, now, events, start)
        elif kind == DISPATCH:
            cores.dispatch(ident, now, events, start)
        elif kind == DONE:
            end[ident] = now
            cores.finish(ident, now, events)
            for nx in graph.succ_task[graph.succ_ptr[ident]:graph.succ_ptr[ident + 1]]:
                need[nx] -= 1
                if need[nx] == 0:
                    heapq.heappush(events, cores.ready_event(int(nx), now))
            for m in graph.out_msg[graph.out_ptr[ident]:graph.out_ptr[ident + 1]]:
                send(int(m), now)
        elif kind == RELEASE:
            send(ident, now)
        else:
            point_done[ident] = now
            target = int(graph.msg_target[ident])
            if target >= 0:
                need[target] -= 1
                if need[target] == 0:
                    heapq.heappush(events, cores.ready_event(target, now))
    return start, end, point_done, links
