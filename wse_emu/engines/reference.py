"""Slow, plain-Python twins of the jitted engines, written for clarity, not speed.

Tests run both on tiny meshes and require identical results. The twin follows the cycle
engine's documented rules literally, with dictionaries and deques instead of packed arrays.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from wse_emu.engines.messages import LINE, RAMP, Messages

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


def cycle_twin(width, height, vcs, qcap, hop, ramp, msgs: Messages, max_cycles):
    """Returns (cycles, t_first, t_done, point_done list per message, link counts dict)."""
    n = width * height
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
    order = list(range(len(msgs)))
    released = 0
    finished = 0
    t = 0
    while t < max_cycles and finished < len(msgs):
        while released < len(msgs) and msgs.t_ready[order[released]] <= t:
            m = order[released]
            send_queue[int(msgs.src[m])].append(m)
            released += 1
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
                    if all(d >= 0 for d in point_done[m]):
                        t_done[m] = t
                        finished += 1
            else:
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
    return t, np.array(t_first), np.array(t_done), point_done, links
