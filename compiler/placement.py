"""Placement of kernels inside a stage: the order of its strips along the long side and the
edge of each strip where outputs collect (its root).

Strips span the stage's short side, so traffic between them runs along the long side on
``short`` parallel lanes. That makes placement one-dimensional and exact to score:
- bytes x hops: each transfer's bytes times the distance between its ports (a transfer to or
  from the attention kernel, which spans the stage, averages over the stage);
- link load: the bytes crossing each cut between two columns, over the lanes; the busiest cut
  is the bottleneck link.
The baseline is data-flow order with every root toward the next kernel; the optimizer anneals
over orders and roots, from a fixed seed, and keeps the best it saw.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from wse_emu.compiler.stages import StageSpec, home_strip
from wse_emu.models import layer as ly
from wse_emu.models.spec import ModelSpec
from wse_emu.program.format import Rect

if TYPE_CHECKING:
    from wse_emu.compiler.layout import StageLayout

STAGE = "@stage"  # the attention kernel, spread over the whole stage
ENTRY = "@entry"  # where the previous stage's output arrives
EXIT = "@exit"  # where the next stage takes this stage's output


@dataclass(frozen=True)
class Transfer:
    src: str  # strip name (its root), STAGE or ENTRY
    dst: str  # strip name, STAGE or EXIT
    nbytes: int  # per decode token, all layers of the stage
    data: str  # what moves; transfers of the same data from one source share a multicast route
    to_edge: bool = False  # True: lands on dst's root edge (an elementwise op), else dst's body


def layer_transfers(model: ModelSpec, experts: tuple[int, int] | None = None) -> list[Transfer]:
    """One layer's (or split layer part's) transfers between strips, read off the layer
    description: an op whose input was left at another site takes it from there (a vector op
    on its root edge, a matrix op across its body). Inputs of several ops at one site travel
    once. What a split layer's first part hands on goes to the home strip's edge, where the
    second part's stage takes it in."""
    d = model.storage.dtype_bytes
    whole = ly.layer_ops(model)
    ops = ly.part_ops(model, experts)
    home = ly.home_site(model)

    def where(s: str) -> str:
        return home if s == ly.HOME else s

    site = {op.name: where(op.site) for op in whole}
    site[ly.LAYER_INPUT] = home
    # Bytes per token of each op's output (a route's: k weights and k expert ids).
    size = {op.name: op.length * (d + ly.TOKEN_ID_BYTES if op.kind == ly.ROUTE else d)
            for op in whole}
    size[ly.LAYER_INPUT] = model.hidden_size * d
    names = {op.name for op in ops}
    if experts is not None and experts[0] > 0:  # arrived with the stage's input
        site.update({name: home for name in ly.SPLIT_CARRIED})
    out: list[Transfer] = []
    if experts is not None and experts[0] == 0:
        out += [Transfer(site[name], home, size[name], name, to_edge=True)
                for name in ly.SPLIT_CARRIED if site[name] != home and name in names]
    seen = set()
    for op in ops:
        op_site = where(op.site)
        for src in op.inputs:
            if site[src] == op_site or (src, op_site) in seen:
                continue
            seen.add((src, op_site))
            dst = STAGE if op_site == ly.STAGE else op_site
            out.append(Transfer(STAGE if site[src] == ly.STAGE else site[src], dst,
                                size[src], src, to_edge=op.kind not in ly.MATRIX_KINDS
                                and op_site != ly.STAGE))
    return out


def stage_transfers(spec: StageSpec, model: ModelSpec) -> list[Transfer]:
    d = model.storage.dtype_bytes
    h = model.hidden_size
    names = {s.name for s in spec.strips}
    home = home_strip(spec).name
    out: list[Transfer] = []
    layers = spec.num_layers
    if "embedding" in names:
        out.append(Transfer("embedding", home, h * d, "embedded", to_edge=True))
    else:
        out.append(Transfer(ENTRY, home, ly.entering_values(model, spec.experts) * d,
                            "stage_input", to_edge=True))
    if layers:
        out.extend(Transfer(t.src, t.dst, t.nbytes * layers, t.data, t.to_edge)
                   for t in layer_transfers(model, spec.experts))
    if "lm_head" in names:
        if home != "lm_head":
            out.append(Transfer(home, "lm_head", h * d, "h_final"))
    else:
        out.append(Transfer(home, EXIT, ly.carried_values(model, spec.experts) * d,
                            "stage_output"))
    return out


class StageScorer:
    """Scores an arrangement of one stage's strips: (bytes x hops, busiest-cut bytes per lane)."""

    def __init__(self, names: list[str], extents: dict[str, int], short: int,
                 transfers: list[Transfer], entry: float, exit_: float):
        self.names = names
        self.extents = extents
        self.length = sum(extents.values())
        self.short = short
        self.transfers = transfers
        self.entry = entry
        self.exit = exit_
        self.nbytes_of = [float(t.nbytes) for t in transfers]
        # Annealing proposes many arrangements it has scored before (a move and its undo, a
        # root flipped twice): each is scored once. The score is a function of the
        # arrangement alone, so a remembered one is the one it would compute.
        self._scored: dict[tuple, float] = {}

    def content(self) -> tuple:
        """Everything a score depends on: two scorers alike in it score every arrangement
        alike."""
        return (tuple(self.names), tuple(sorted(self.extents.items())), self.short,
                tuple(self.transfers), self.entry, self.exit)

    def ports(self, order: list[str], roots: dict[str, bool]):
        """Per transfer: source and destination coordinates along the long side (NaN for a
        stage-wide end), and where each strip starts."""
        start, u = {}, 0
        for name in order:
            start[name] = u
            u += self.extents[name]

        def root(name):
            return start[name] + (self.extents[name] - 1 if roots[name] else 0)

        def body(name):
            return start[name] + (self.extents[name] - 1) / 2

        src, dst = [], []
        for t in self.transfers:
            if t.src == STAGE:
                src.append(math.nan)
            else:
                src.append(self.entry if t.src == ENTRY else root(t.src))
            if t.dst == STAGE:
                dst.append(math.nan)
            elif t.dst == EXIT:
                dst.append(self.exit)
            else:
                dst.append(root(t.dst) if t.to_edge else body(t.dst))
        return src, dst, start

    def score(self, order: list[str], roots: dict[str, bool]) -> tuple[float, float]:
        """(bytes x hops, the busiest cut's bytes per lane). In plain Python over a stage's
        dozen or so transfers, where numpy's calls on arrays this small cost more than the
        arithmetic; every sum is taken in the order numpy's would be (``_numpy_sum``; a
        load, transfer by transfer), so that every score, and every annealing, is the one
        numpy's arrays gave, to the bit."""
        src, dst, start = self.ports(order, roots)
        length, short = self.length, self.short
        # A transfer with a stage-wide end: its other end (None: point to point).
        point = [None if (a == a and b == b) else (b if a != a else a)
                 for a, b in zip(src, dst)]
        # Point to point: |src - dst|. Point to the whole stage: the mean distance to a column.
        across = 2 * max(length - 1, 1)
        bytes_hops = _numpy_sum([n * (abs(a - b) if p is None else _far_squares(p, length)
                                      / across)
                                 for n, a, b, p in zip(self.nbytes_of, src, dst, point)])
        # Cuts between columns c-1 and c, at every place a load can change.
        cand = {float(start[n]) for n in order}
        cand.update(float(start[n] + self.extents[n]) for n in order)
        cand.update(math.floor(e) + 1.0 for e in (*src, *dst) if e == e)
        cuts = sorted(c for c in cand if 0 < c < length)
        if not cuts:
            return bytes_hops, 0.0
        # What each transfer adds at a cut: its bytes where it crosses point to point; with a
        # stage-wide end, its bytes times the share of the stage on the far side of the cut.
        if len(cuts) == 1:  # numpy sums a lone cut's column pairwise, every term in its place
            c = cuts[0]
            return bytes_hops, _numpy_sum([
                n * (_far_share(p, c, length) if p is not None
                     else (1.0 if min(a, b) < c <= max(a, b) else 0.0))
                for n, a, b, p in zip(self.nbytes_of, src, dst, point)]) / short
        loads = [0.0] * len(cuts)  # numpy sums several cuts' columns row by row
        for n, a, b, p in zip(self.nbytes_of, src, dst, point):
            if p is None:  # the cuts it crosses: lo < c <= hi
                for k in range(bisect_right(cuts, min(a, b)), bisect_right(cuts, max(a, b))):
                    loads[k] += n
            else:
                for k, c in enumerate(cuts):
                    loads[k] += n * _far_share(p, c, length)
        # The largest load's share per lane is the largest share (division is monotone).
        return bytes_hops, max(loads) / short

    def objective(self, order, roots) -> float:
        key = tuple((name, roots[name]) for name in order)
        value = self._scored.get(key)
        if value is None:
            bytes_hops, max_load = self.score(order, roots)
            # A busiest-link byte costs as much as a byte sent across the whole stage.
            value = self._scored[key] = bytes_hops + max_load * self.length
        return value


def _far_squares(p: float, length: int) -> float:
    """The squared distances from ``p`` to the stage's two ends, summed (each squared by a
    product, as numpy squares)."""
    q = length - 1 - p
    return p * p + q * q


def _far_share(p: float, c: float, length: int) -> float:
    """The share of the stage on the far side of cut ``c`` from point ``p``."""
    return (length - c) / length if p < c else c / length


def _numpy_sum(values: list[float]) -> float:
    """``values`` added in the order numpy's ``sum`` of a float64 vector adds them: below
    eight in turn; up to 128 in eight running sums (every eighth value each), joined in pairs,
    then the rest in turn; beyond that, each half so, and the halves added."""
    return _pairwise(values, 0, len(values))


def _pairwise(values: list[float], lo: int, n: int) -> float:
    if n < 8:
        total = -0.0
        for i in range(lo, lo + n):
            total += values[i]
        return total
    if n <= 128:
        r = values[lo:lo + 8]
        i = 8
        while i < n - n % 8:
            for j in range(8):
                r[j] += values[lo + i + j]
            i += 8
        total = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))
        for k in range(i, n):
            total += values[lo + k]
        return total
    half = n // 2
    half -= half % 8
    return _pairwise(values, lo, half) + _pairwise(values, lo + half, n - half)


def baseline_arrangement(spec: StageSpec) -> tuple[list[str], dict[str, bool]]:
    """Data-flow order, every root on the high end (toward the next kernel)."""
    order = [s.name for s in spec.strips]
    return order, {n: True for n in order}


# Annealings already run in this process, by what they depend on: a program's layouts are
# tried more than once (a region size after another), and an experiment compiles many
# programs with stages alike; annealing from a fixed seed, each gives the same arrangement.
_ANNEALED: dict[tuple, tuple[list[str], dict[str, bool]]] = {}
_ANNEALED_KEPT = 256


def forget_annealed() -> None:
    """Forget the annealings run so far (a benchmark times a compile with none remembered)."""
    _ANNEALED.clear()


def anneal(scorer: StageScorer, order: list[str], roots: dict[str, bool], steps: int,
           seed: int) -> tuple[list[str], dict[str, bool]]:
    """The best arrangement annealing from (``order``, ``roots``) sees in ``steps`` steps
    from ``seed`` (the same as before when the same was annealed before)."""
    key = (scorer.content(), tuple(order), tuple(sorted(roots.items())), steps, seed)
    if key not in _ANNEALED:
        if len(_ANNEALED) >= _ANNEALED_KEPT:
            _ANNEALED.clear()
        _ANNEALED[key] = _annealed(scorer, order, roots, steps, seed)
    best_o, best_r = _ANNEALED[key]
    return list(best_o), dict(best_r)


def _annealed(scorer: StageScorer, order: list[str], roots: dict[str, bool], steps: int,
              seed: int) -> tuple[list[str], dict[str, bool]]:
    rng = np.random.default_rng(seed)
    cur_o, cur_r = list(order), dict(roots)
    cur = scorer.objective(cur_o, cur_r)
    best_o, best_r, best = list(cur_o), dict(cur_r), cur
    n = len(order)
    if n < 2 or steps <= 0:
        return best_o, best_r
    t0 = max(cur * 0.05, 1e-9)
    for step in range(steps):
        temp = t0 * (1e-4 ** (step / steps))
        new_o, new_r = list(cur_o), dict(cur_r)
        move = rng.integers(3)
        if move == 0:
            i, j = rng.choice(n, size=2, replace=False)
            new_o[i], new_o[j] = new_o[j], new_o[i]
        elif move == 1:
            name = new_o[rng.integers(n)]
            new_r[name] = not new_r[name]
        else:
            i, j = rng.choice(n, size=2, replace=False)
            new_o.insert(int(j), new_o.pop(int(i)))
        value = scorer.objective(new_o, new_r)
        if value <= cur or rng.random() < math.exp(-(value - cur) / temp):
            cur_o, cur_r, cur = new_o, new_r, value
            if value < best:
                best_o, best_r, best = list(new_o), dict(new_r), value
    return best_o, best_r


def mirror(order: list[str], roots: dict[str, bool]) -> tuple[list[str], dict[str, bool]]:
    return list(reversed(order)), {k: not v for k, v in roots.items()}


# --- every stage of a region -----------------------------------------------------------

def _ends(lay: StageLayout, prev: Rect | None, nxt: Rect | None) -> tuple[float, float]:
    """Where the previous stage's output arrives and the next stage's input leaves, projected
    on this stage's long side (the middle when there is no neighbour on the wafer)."""
    def project(other: Rect | None) -> float:
        if other is None:
            return (lay.long - 1) / 2
        cx, cy = other.center()
        u = cx - lay.rect.x if lay.axis == "x" else cy - lay.rect.y
        return float(min(max(u, 0), lay.long - 1))
    return project(prev), project(nxt)


def _scorer(lay: StageLayout, model, prev, nxt) -> StageScorer:
    entry, exit_ = _ends(lay, prev, nxt)
    return StageScorer([s.name for s in lay.spec.strips], lay.extents, lay.short,
                          stage_transfers(lay.spec, model), entry, exit_)


def arrange(layouts: list[list[StageLayout]], model, options) -> None:
    canonical: dict[tuple, tuple[list[str], dict[str, bool], bool]] = {}
    for part in layouts:
        for i, lay in enumerate(part):
            prev = part[i - 1].rect if i > 0 else None
            nxt = part[i + 1].rect if i + 1 < len(part) else None
            scorer = _scorer(lay, model, prev, nxt)
            forward = scorer.entry <= scorer.exit
            base_o, base_r = baseline_arrangement(lay.spec)
            if not forward:
                base_o, base_r = mirror(base_o, base_r)
            order, roots = base_o, base_r
            if options.optimize_placement:
                kind = (tuple(s.name for s in lay.spec.strips), lay.spec.num_layers,
                        lay.spec.experts is not None)
                if kind not in canonical:
                    o, r = anneal(scorer, base_o, base_r, options.anneal_steps, options.seed)
                    canonical[kind] = (o, r, forward)
                o, r, fwd = canonical[kind]
                if fwd != forward:
                    o, r = mirror(o, r)
                if scorer.objective(o, r) < scorer.objective(base_o, base_r):
                    order, roots = o, r
            lay.order, lay.roots = order, roots
            lay.baseline = (base_o, base_r)
            lay.scorer = scorer
