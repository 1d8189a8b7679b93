"""The layouts each plan may take on one compiled cluster: colocated with some copies of the
model per wafer, disaggregated at each split of the systems, each at the compiler's own pipeline
depth and at the depths asked for; compiled on the experiment's workers, their stage tables timed
together."""

from __future__ import annotations

from pathlib import Path

from wse_emu.compiler.cache import compile_kept
from wse_emu.compiler.mapper import compile_model
from wse_emu.compiler.options import CompileOptions
from wse_emu.compiler.partition import disaggregated_splits, wafers_needed
from wse_emu.errors import CompileError, UserError
from wse_emu.experiments.comparison import Space
from wse_emu.experiments.tuning import Layout
from wse_emu.hardware.fabric import ClusterSpec, FabricSpec
from wse_emu.models.spec import ModelSpec
from wse_emu.pools.kinds.wafer import wafer_pools_of
from wse_emu.program.format import WaferProgram
from wse_emu.serving.serve import position_shortfall
from wse_emu.serving.tables import longest_context
from wse_emu.serving.workload import Requests
from wse_emu.util.workers import HERE


def build_layouts(model: ModelSpec, cluster: ClusterSpec, probes: list[Requests], cache: Path,
                  space: Space, timing, pool=None, progress=None) -> tuple[dict, list[str]]:
    """Every layout to tune, as ``space`` asks (a ``comparison.Space``): colocated with each
    number of its ``copies`` of the model per wafer (side by side in column bands), and
    disaggregated at each of its ``splits`` of the cluster (``proposed_splits``), each at the
    compiler's own pipeline depth and at the other depths (layers per stage) its
    ``layers_per_stage`` asks for: "own", none; "matched", every depth some layout came to by
    itself, so that both plans get the same choice; or numbers; every step timed as
    ``timing`` (a ``spec.WaferTiming``) says. A layout that does not compile is skipped, with
    why (colocated with one copy at its own depth must compile). A layout whose regions
    cannot hold some request stays: serving refuses that request, which then misses its
    targets, so which layouts are tried does not depend on how long the runs are. ``probes``
    (every set of requests the experiment may serve) are checked against the model's
    positions. Layouts are compiled, and their stage tables timed over the space's grid, on
    ``pool``'s workers (in this process without one); both are kept in ``cache`` for the next
    experiment, the programs in its ``programs`` folder (under the user's cache, the one
    ``wse-emu serve`` reads; a cache given by hand holds them too, so an empty one compiles
    them afresh). Returns (plan, name) -> Layout, and the skipped."""
    copies, grid, layers_per_stage = space.copies, space.grid, space.layers_per_stage
    routing, attention_tile = timing.routing, timing.attention_tile
    splits = proposed_splits(model, cluster, space.splits)
    fabric = cluster.fabric
    span = wafers_needed(model, fabric)
    if not splits:
        raise UserError(f"{model.name} spans {span} x {fabric.name} per replica, so "
                        f"{cluster.systems} system(s) leave no prefill/decode split to compare: "
                        f"it needs {2 * span} systems or more")
    short = next(filter(None, (position_shortfall(r, model) for r in probes)), None)
    if short:  # the same on every layout, so refused before any is compiled
        raise UserError(short)
    reach = longest_context(*probes)  # the tables time every context the runs reach
    plans, skipped = _layout_plans(model, fabric, span, copies, splits,
                                   drafted=timing.draft is not None)

    def compile_all(batch: list) -> dict:
        """(plan, name) -> program of every (plan, name, split, depth, draft columns) in
        ``batch`` that compiles, compiled on ``pool``'s workers; the others skipped, with why
        (colocated with one copy at its own depth must compile)."""
        if progress:
            progress(f"compiling {len(batch)} layout{'s' if len(batch) > 1 else ''}")
        jobs = [(CompileOptions(plan=plan, routing=routing.spec(), routing_seed=routing.seed,
                                attention_tile=attention_tile, layers_per_stage=depth,
                                draft=timing.draft, draft_columns=columns, **split),)
                for plan, _, split, depth, columns in batch]
        run = (pool or HERE).bind(compile_or_why, (model, cluster, cache))
        out = {}
        for (plan, name, split, depth, columns), (program, why) in zip(batch, run(jobs)):
            if program is not None:
                out[(plan, name)] = program
            elif plan == "colocated" and not split and depth is None and columns is None:
                raise CompileError(why)
            else:
                skipped.append(f"{plan} {name}: {' '.join(why.split())}")
        return out

    # At the compiler's own depth first, then at the other depths asked for, then each
    # beside the draft's wider strips asked for.
    programs = compile_all([(plan, name, split, None, None) for plan, name, split in plans])
    own = {key: _layers_per_stage(p) for key, p in programs.items()}
    depths = {"own": [], "matched": sorted(set(own.values()))}.get(layers_per_stage)
    if depths is None:  # numbers, checked as ``Space`` checks them
        depths = Space(layers_per_stage=layers_per_stage).layers_per_stage
    deeper = [(plan, f"{name} at {depth} layer{'s' if depth > 1 else ''}/stage", split, depth,
               None)
              for plan, name, split in plans for depth in depths
              if (plan, name) in programs and depth != own[(plan, name)]]
    if deeper:
        programs.update(compile_all(deeper))
    wider = _wider_strips(programs, plans, deeper, timing.draft_strips, fabric, skipped)
    if wider:
        programs.update(compile_all(wider))
    # Every layout's tables at once, so that stages alike across layouts are timed once and
    # no core waits for one layout's last shape.
    if timing.draft is None:
        pools = wafer_pools_of(list(programs.values()), cache, grid=grid, pool=pool,
                               reach=reach)
        layouts = {(plan, name): Layout(plan, name, regions)
                   for (plan, name), regions in zip(programs, pools)}
    else:
        layouts = _speculative_layouts(programs, cache, grid, pool, timing.draft_tokens, reach)
    if not any(plan == "disaggregated" for plan, _ in layouts):
        raise UserError("no disaggregated split compiles: " + "; ".join(skipped))
    return layouts, skipped


def _wider_strips(programs: dict, plans: list, deeper: list, strips: tuple,
                  fabric: FabricSpec, skipped: list) -> list:
    """The (plan, name, split, depth, draft columns) of each compiled layout again beside the
    draft's strip ``strips`` times as wide as its narrowest (a multiple of 1: that one, which
    it has); a width past half the wafer's columns skipped, with why."""
    batch = []
    for plan, name, split, depth, _ in [(*p, None, None) for p in plans] + deeper:
        program = programs.get((plan, name))
        if program is None or program.draft is None:
            continue
        narrowest = program.summary["draft"]["strip_columns"]
        for columns in dict.fromkeys(round(m * narrowest) for m in strips):
            if columns == narrowest:
                continue
            if columns > fabric.width // 2:
                skipped.append(f"{plan} {name} beside a strip of {columns} columns: more than "
                               f"half of {fabric.name}'s {fabric.width}")
                continue
            batch.append((plan, f"{name}, strip {columns}", split, depth, columns))
    return batch


def _speculative_layouts(programs: dict, cache: Path, grid: str, pool,
                         draft_tokens: tuple, reach: int) -> dict:
    """Each compiled layout (with its draft) at each number of drafted tokens: a layout of
    its own, "1 copy, K 4", so that tuning tries every count on both plans alike."""
    layouts = {}
    for k in draft_tokens:
        pools = wafer_pools_of(list(programs.values()), cache, grid=grid, pool=pool,
                               draft_tokens=k, reach=reach)
        for (plan, name), regions in zip(programs, pools):
            draft_kv = programs[(plan, name)].draft.model.kv_bytes_per_token()
            layouts[(plan, f"{name}, K {k}")] = Layout(plan, f"{name}, K {k}", regions,
                                                       draft_tokens=k,
                                                       draft_kv_bytes_per_token=draft_kv)
    return layouts


def proposed_splits(model: ModelSpec, cluster: ClusterSpec, which: str = "all") -> list[dict]:
    """The disaggregated splits of ``cluster`` to try (``Space.splits``): every one the
    compiler proposes, or the middle one."""
    splits = disaggregated_splits(model, cluster)
    return splits if which == "all" else splits[len(splits) // 2:][:1]


def compile_or_why(model: ModelSpec, cluster: ClusterSpec, cache: Path | None,
                   options: CompileOptions) -> tuple[WaferProgram | None, str | None]:
    """The program (read back from the cache folder ``cache`` when it holds it, else
    compiled and kept there: ``compiler.cache.compile_kept``; None: compiled, not kept), or
    None and why it does not compile (a job for a worker pool)."""
    try:
        return compile_kept(model, cluster, options, compile_model, cache), None
    except CompileError as exc:
        return None, str(exc)


def _layout_plans(model: ModelSpec, fabric: FabricSpec, span: int, copies,
                  splits: list[dict], drafted: bool = False) -> tuple[list, list[str]]:
    """(plan, name, compile options) of every layout, and those no wafer can take (with a
    draft, a wafer holds one copy of the model, beside its draft: ``compiler.draft``)."""
    plans, skipped = [], []
    for n in sorted(set(copies) | {1}):
        name = f"{n} cop{'y' if n == 1 else 'ies'}"
        if n == 1:
            plans.append(("colocated", name, {}))
        elif drafted:
            skipped.append(f"colocated {name}: with a draft, a wafer holds one copy of the "
                           "model beside its draft")
        elif span > 1:
            skipped.append(f"colocated {name}: {model.name} spans {span} wafers of "
                           f"{fabric.name}, so a wafer holds no whole copy")
        elif n > fabric.width:
            skipped.append(f"colocated {name}: a wafer has only {fabric.width} columns")
        else:
            plans.append(("colocated", name, {"region": (fabric.width // n, fabric.height)}))
    for split in splits:
        if "prefill_share" in split:
            name = f"share {split['prefill_share']:g}"
        else:
            n = split["prefill_systems"]
            name = f"{n} prefill system{'s' if n > 1 else ''}"
        plans.append(("disaggregated", name, split))
    return plans, skipped


def _layers_per_stage(program) -> int:
    """The most layers any stage of ``program`` holds: its pipeline's depth, as compiled."""
    return max(s.layers[1] - s.layers[0] for s in program.stages)
