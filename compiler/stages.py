"""Pipeline stages: which layers each stage holds, how much area each gets, and where.

A stage holds consecutive layers stacked on one rectangle: each of its matrix kernels is a strip
of the rectangle (full length of the short side, an extent along the long side) that owns that
matrix of every layer in the stage. The embedding joins the region's first stage and the final
norm plus LM head its last stage.

Areas balance the bottleneck. A decode step reads every weight once and a prefill does two
FLOPs per weight per token, so a strip's work is proportional to its weight bytes, and the time
its PEs need is that work over its area. Giving every strip (and so every stage) area in
proportion to its work makes the busiest strip, which bounds the stage whatever the schedule,
as fast as the region allows. Capacity wins over speed: no strip gets less area than its
weights need; the embedding, which gathers one row per token, gets just that.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from wse_emu.compiler.geometry import proportional_split
from wse_emu.compiler.tiling import min_cross_extent
from wse_emu.errors import CompileError
from wse_emu.models import layer as ly
from wse_emu.models.spec import ModelSpec


@dataclass
class StripSpec:
    name: str
    k: int
    n: int
    layers: int
    weight_bytes: int  # matrix bytes over all layers of the stage
    vectors: dict[str, int] = field(default_factory=dict)  # name -> length, per layer
    vector_layers: dict[str, int] = field(default_factory=dict)
    bytes_per_weight: float = 2  # the matrix's storage format
    experts_op: ly.Op | None = None  # an expert strip's op (its experts along the strip)

    @property
    def experts(self) -> int:
        return self.experts_op.experts if self.experts_op is not None else 0

    @property
    def experts_summed(self) -> bool:
        """An expert strip whose reduction sums its experts (down), else per expert."""
        return self.experts_op is not None and self.experts_op.experts_summed

    @property
    def spread_vectors(self) -> bool:
        """Vectors spread over the body instead of the root edge: an expert strip's biases,
        E times a dense one's, would crowd its edge line."""
        return self.experts_op is not None

    def transposed(self, short_side: int) -> bool:
        """A strip with fewer outputs than the stage is wide (a router: E logits) lays its
        inputs across the stage and its outputs along the strip instead: each PE takes only
        its slice of the input vector where it already lies, and the partial sums of the few
        outputs meet across the stage, instead of every PE of one line taking in the whole
        input vector while most of the line holds no weights."""
        return self.experts_op is None and self.name != "embedding" and self.n < short_side

    def shape(self, rows: int) -> tuple[int, int]:
        """(K, N) on a strip ``rows`` rows across (gate's and up's runs grouped:
        ``ly.Op.run_matrix``)."""
        return self.experts_op.run_matrix(rows) if self.experts_op is not None \
            else (self.k, self.n)

    @property
    def work(self) -> float:
        """Decode work: bytes read per token. The embedding gathers one row: no area needed;
        an expert strip reads its token's experts only."""
        if self.name == "embedding":
            return 0.0
        share = self.experts_op.top_k / self.experts_op.total_experts \
            if self.experts_op is not None else 1.0
        return float(self.weight_bytes) * share


@dataclass
class StageSpec:
    layers: tuple[int, int]
    has_embedding: bool
    has_head: bool
    strips: list[StripSpec]
    experts: tuple[int, int] | None = None  # one part of a split layer: its experts

    @property
    def num_layers(self) -> int:
        return self.layers[1] - self.layers[0]

    def weight_bytes(self, dtype_bytes: int) -> int:
        vec = sum(length * s.vector_layers[name] * dtype_bytes
                  for s in self.strips for name, length in s.vectors.items())
        return sum(s.weight_bytes for s in self.strips) + vec


def stage_spec(model: ModelSpec, l0: int, l1: int, first: bool, last: bool,
               experts: tuple[int, int] | None = None) -> StageSpec:
    """The strips of a stage, from the layer description: one per matrix op (each owning that
    matrix of every layer in the stage), with the weight vectors of the ops that run on its
    root edge (norm scales; a projection's bias lives on its own edge). ``experts``: the stage
    holds one part of a split layer (``layer.part_ops``)."""
    n_layers = l1 - l0
    strips: list[StripSpec] = []
    by_name: dict[str, StripSpec] = {}

    def add_strip(op: ly.Op, layers: int) -> None:
        k, n = op.strip_matrix
        per_weight = model.storage.matrix_bytes_per_weight(expert=op.kind == ly.EXPERT_GEMM)
        s = StripSpec(op.name, k, n, layers, math.ceil(k * n * layers * per_weight),
                      bytes_per_weight=per_weight, experts_op=op if op.experts else None)
        if op.bias:
            length = n * max(op.experts, 1)  # each expert's own
            s.vectors[op.name[0] + "_bias"] = length
            s.vector_layers[op.name[0] + "_bias"] = layers
        strips.append(s)
        by_name[op.name] = s

    def add_vector(op: ly.Op, layers: int, site: str) -> None:
        if op.weight_params and op.kind in ly.NORM_KINDS:
            by_name[site].vectors[op.name] = op.weight_params
            by_name[site].vector_layers[op.name] = layers

    if first and not model.tie_embeddings:
        emb = next(op for op in ly.input_ops(model) if op.kind == ly.EMBEDDING)
        s = StripSpec("embedding", emb.matrix[0], emb.matrix[1], 1,
                      math.ceil(model.embedding_weight_bytes()),
                      bytes_per_weight=model.storage.matrix_bytes_per_weight())
        strips.append(s)
        by_name["embedding"] = s
    if n_layers:
        ops = ly.part_ops(model, experts)
        for op in ops:
            if op.kind in ly.MATRIX_KINDS:
                add_strip(op, n_layers)
        home = ly.home_site(model)
        for op in ops:
            site = home if op.site == ly.HOME else op.site
            if site in by_name:
                add_vector(op, n_layers, site)
    if last:
        outputs = ly.output_ops(model)
        for op in outputs:
            if op.kind == ly.GEMM:
                add_strip(op, 1)
        home = ly.home_site(model) if n_layers else "lm_head"
        for op in outputs:
            add_vector(op, 1, home if op.site == ly.HOME else op.site)
    return StageSpec((l0, l1), first, last, strips, experts)


def home_strip(spec: StageSpec) -> StripSpec:
    """The strip whose output edge holds the stage's residual stream."""
    names = {s.name: s for s in spec.strips}
    return (names.get("down_proj") or names.get("experts_down") or names.get("lm_head")
            or names["embedding"])


def split_layers(layer_bytes: int, num_layers: int, part_budgets: list[float],
                 extra_first: float, extra_last: float) -> list[tuple[int, int]]:
    """Contiguous layer ranges, one per part, that minimize the fullest part's share of its
    budget; the embedding and the head add to the first and last part."""
    parts = len(part_budgets)
    if parts == 1:
        return [(0, num_layers)]
    if num_layers < parts:
        raise CompileError(f"{num_layers} layers cannot be pipelined over {parts} wafers")

    def fits(limit: float) -> list[tuple[int, int]] | None:
        """Fill parts front to back, leaving at least one layer for every later part."""
        ranges, start = [], 0
        for p in range(parts):
            extra = (extra_first if p == 0 else 0.0) + (extra_last if p == parts - 1 else 0.0)
            room = limit * part_budgets[p] - extra
            count = max(0, int(room // layer_bytes)) if room > 0 else 0
            count = min(count, num_layers - start - (parts - 1 - p))
            if p == parts - 1:
                count = num_layers - start
                if count * layer_bytes + extra > limit * part_budgets[p] + 1e-6:
                    return None
            if count < 1:
                return None
            ranges.append((start, start + count))
            start += count
        return ranges

    return _tightest(fits)


def _tightest(fits):
    """``fits(limit)`` (a plan filling each part to at most ``limit`` of its budget, or None)
    at the least limit that has a plan, found by bisection."""
    lo, hi = 0.0, 4.0
    while fits(hi) is None and hi < 1e6:
        hi *= 2.0
    if fits(hi) is None:
        raise CompileError("cannot split the layers across the region's wafers")
    for _ in range(60):
        mid = (lo + hi) / 2
        if fits(mid) is None:
            lo = mid
        else:
            hi = mid
    return fits(hi)


# A wafer's share of a region's layers: (layer, experts) items in order, experts None for a
# whole layer or the range of experts of a split layer's part (``layer.part_ops``).
LayerItem = tuple[int, "tuple[int, int] | None"]


def split_layers_in_parts(model: ModelSpec, part_budgets: list[float], extra_first: float,
                          extra_last: float) -> list[list[LayerItem]]:
    """Like ``split_layers``, but a mixture-of-experts layer may be cut between two wafers, its
    attention, router and first experts ending one wafer and its other experts starting the
    next: the layers then fill the wafers as their experts' bytes allow, not only in whole
    layers (a wafer holding 7.8 of a model's layers no longer stops at 7)."""
    layers, experts = model.num_layers, model.experts.count
    ops = ly.layer_ops(model)
    expert_bytes = sum(ly.weight_bytes(op, model) for op in ops
                       if op.kind == ly.EXPERT_GEMM) / experts
    layer_bytes = model.layer_weight_bytes()
    lead_bytes = layer_bytes - experts * expert_bytes  # attention, norms and router
    parts = len(part_budgets)

    def fits(limit: float) -> list[list[LayerItem]] | None:
        plan: list[list[LayerItem]] = []
        layer, split = 0, 0  # the next layer, and its experts already placed (a split's tail)
        for p in range(parts):
            room = limit * part_budgets[p] - (extra_first if p == 0 else 0.0) \
                - (extra_last if p == parts - 1 else 0.0)
            items: list[LayerItem] = []
            if split:
                need = (experts - split) * expert_bytes
                if need > room:
                    return None
                items.append((layer, (split, experts)))
                room -= need
                layer, split = layer + 1, 0
            # (leaving every later wafer at least one layer)
            while layer < layers - (parts - 1 - p) and layer_bytes <= room:
                items.append((layer, None))
                room -= layer_bytes
                layer += 1
            if layer < layers and p < parts - 1 and room < layer_bytes:
                # The next layer's attention, router and as many experts as the room holds
                # (never all: a whole layer held back for a later wafer stays whole).
                held = min(int((room - lead_bytes) // expert_bytes), experts - 1)
                if held >= 1:
                    items.append((layer, (0, held)))
                    split = held
            if not items:
                return None
            plan.append(items)
        return plan if layer == layers else None

    return _tightest(fits)


def allocate_areas(specs: list[StageSpec], total_area: int,
                   min_areas: list[list[float]]) -> list[list[float]]:
    """Continuous area per strip, proportional to its work and at least its minimum, summing
    to ``total_area`` (see the module docstring)."""
    flat_w = np.array([s.work for spec in specs for s in spec.strips], dtype=float)
    flat_m = np.array([m for ms in min_areas for m in ms], dtype=float)
    if flat_m.sum() > total_area:
        raise CompileError("weights do not fit in the region")
    # Area per unit of work, found by bisection so that max(minimum, work * scale) fills the
    # region exactly.
    def total(scale: float) -> float:
        return float(np.maximum(flat_m, flat_w * scale).sum())

    lo, hi = 0.0, 1.0
    while total(hi) < total_area and hi < 1e30:
        hi *= 2.0
    for _ in range(100):
        mid = (lo + hi) / 2
        if total(mid) < total_area:
            lo = mid
        else:
            hi = mid
    flat_a = np.maximum(flat_m, flat_w * lo)
    out, i = [], 0
    for spec in specs:
        out.append(list(flat_a[i:i + len(spec.strips)]))
        i += len(spec.strips)
    return out


@dataclass
class StageRect:
    x: int
    y: int
    w: int
    h: int


def layout_stages(width: int, height: int, areas: list[float],
                  min_long: list[int]) -> list[StageRect]:
    """Stage rectangles tiling width x height in serpentine bands (left to right, then right
    to left), stage areas close to ``areas``; each stage's long side is at least its
    ``min_long``. Picks the band count whose worst stage is closest to square."""
    n = len(areas)
    areas = np.asarray(areas, dtype=float)
    best, best_key = None, None
    for bands in range(1, n + 1):
        if bands > height:
            break
        groups = _contiguous_groups(areas, bands)
        if groups is None:
            continue
        sums = [areas[a:b].sum() for a, b in groups]
        try:
            heights = regular_split(height, np.array(sums))
        except ValueError:
            continue
        rects: list[StageRect | None] = [None] * n
        y, ok = 0, True
        for band, ((a, b), hh) in enumerate(zip(groups, heights)):
            if b - a > width:
                ok = False
                break
            widths = regular_split(width, areas[a:b])
            xs = np.concatenate([[0], np.cumsum(widths)[:-1]])
            for idx, (x, ww) in enumerate(zip(xs, widths)):
                stage = a + idx
                if band % 2 == 1:  # serpentine: odd bands run right to left
                    x = width - x - ww
                rects[stage] = StageRect(int(x), int(y), int(ww), int(hh))
            y += hh
        if not ok:
            continue
        longs = [max(r.w, r.h) for r in rects]
        if any(lg < m for lg, m in zip(longs, min_long)):
            continue
        worst = max(max(r.w, r.h) / min(r.w, r.h) for r in rects)
        key = (worst, bands)
        if best_key is None or key < best_key:
            best, best_key = rects, key
    if best is None:
        raise CompileError("stages do not fit")
    return best


def regular_split(total: int, weights: np.ndarray) -> np.ndarray:
    """Like ``proportional_split`` with minimum 1, but pieces of equal weight get equal sizes
    (what is left over goes to the heaviest piece), so that stages of equal work get the same
    shape and the simulator can time one of them for all."""
    sizes = proportional_split(total, weights, 1)
    if len(weights) < 2:
        return sizes
    _, group = np.unique(np.round(np.asarray(weights, dtype=float), 6), return_inverse=True)
    for g in np.unique(group):
        members = group == g
        if members.sum() > 1:
            sizes[members] = max(1, int(sizes[members].min()))
    heaviest = int(np.argmax(weights))
    sizes[heaviest] += total - sizes.sum()
    if sizes[heaviest] < 1:
        return proportional_split(total, weights, 1)
    return sizes


def _contiguous_groups(values: np.ndarray, groups: int) -> list[tuple[int, int]] | None:
    n = len(values)
    if groups > n:
        return None
    cum = np.cumsum(values)
    targets = cum[-1] * np.arange(1, groups) / groups
    cuts = []
    prev = 0
    for j, t in enumerate(targets):
        idx = int(np.searchsorted(cum, t))
        # Cut after item idx or before it, whichever leaves the running sum closer to target.
        closer_after = idx == 0 or abs(cum[idx] - t) <= abs(cum[idx - 1] - t)
        cut = idx + 1 if idx < n and closer_after else idx
        cut = max(cut, prev + 1)
        cut = min(cut, n - (groups - 1 - j))
        cuts.append(cut)
        prev = cut
    bounds = [0] + cuts + [n]
    return [(bounds[i], bounds[i + 1]) for i in range(groups)]


def strip_min_extent(strip: StripSpec, short_side: int, budget: int,
                     dtype_bytes: int) -> int | None:
    """The fewest PEs along the stage's long side that hold the strip's blocks and its
    output-edge vectors within ``budget`` bytes per PE; None if impossible."""
    if strip.spread_vectors:
        # Spread over the body: each line along the strip shares its row's values.
        k, n = strip.shape(short_side)
        lo = min_cross_extent(k, n, strip.layers, strip.bytes_per_weight, short_side, "rows",
                              budget)

        def fits(extent: int) -> bool:
            return max_block(strip, extent, short_side) + spread_bytes(
                strip, extent, short_side, dtype_bytes) <= budget

        if lo is None or not fits(k):
            return None
        hi = k  # both shares only shrink as the strip grows: the fewest that fit, by halves
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if fits(mid) else (mid + 1, hi)
        return max(1, lo)
    if strip.transposed(short_side):
        # Inputs split across the stage, outputs along the strip (and its edge's vectors).
        k_slice = -(-strip.k // short_side)
        for extent in range(1, strip.n + 1):
            block = math.ceil(k_slice * -(-strip.n // extent) * strip.layers
                              * strip.bytes_per_weight)
            vec = sum(-(-length // extent) * strip.vector_layers[name] * dtype_bytes
                      for name, length in strip.vectors.items())
            if block + vec <= budget:
                return extent
        return None
    vec = sum(-(-length // short_side) * strip.vector_layers[name] * dtype_bytes
              for name, length in strip.vectors.items())
    room = budget - vec
    if room <= 0:
        return None
    extent = min_cross_extent(strip.k, strip.n, strip.layers, strip.bytes_per_weight,
                              short_side, "rows", room)
    return None if extent is None else max(1, extent)


def spread_bytes(strip: StripSpec, extent: int, short_side: int, dtype_bytes: int) -> int:
    """The most bytes of spread vectors a PE holds: its row's share, split along the strip."""
    return sum(-(-(-(-length // short_side)) // extent) * strip.vector_layers[name] * dtype_bytes
               for name, length in strip.vectors.items())


def max_block(strip: StripSpec, extent: int, short_side: int) -> int:
    """The largest PE block's bytes with the strip ``extent`` PEs long."""
    k, n = strip.shape(short_side)
    return math.ceil(-(-k // extent) * -(-n // short_side) * strip.layers
                     * strip.bytes_per_weight)


def strip_extents(spec: StageSpec, areas: list[float], long_side: int, short_side: int,
                  budget: int, dtype_bytes: int) -> np.ndarray | None:
    """Integer extents along the long side, one per strip, proportional to ``areas`` and each
    at least its capacity minimum; None if the minimums do not fit."""
    mins = []
    for s in spec.strips:
        m = strip_min_extent(s, short_side, budget, dtype_bytes)
        if m is None:
            return None
        mins.append(m)
    if sum(mins) > long_side:
        return None
    return proportional_split(long_side, areas, np.array(mins))
