"""Run one prefill or decode step of a compiled program on one region, stage by stage.

Stages of the same shape (same kernel geometry, layer count and attention windows) take the
same time for the same micro-batch, so each distinct shape is simulated once and its result reused
(``reuse=False`` simulates every stage, which tests compare against). Between stages the
activation moves over the fabric (or the off-wafer link) on parallel lanes.

A decode step's latency is the sum of its stages and transfers. A prefill streams its prompt
through the pipeline in token tiles, so its latency is the first tile's trip through every
stage plus the remaining tiles at the pace of the slowest stage (a flow shop).
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from wse_emu.errors import UserError
from wse_emu.models import layer as ly
from wse_emu.models.layer import MicroBatch
from wse_emu.models.routing import load_summary, routing_of
from wse_emu.program.format import Stage, WaferProgram
from wse_emu.util.checks import one_of, short_repr, whole
from wse_emu.util.fmt import seconds, with_unit
from wse_emu.util.splits import even_split

# The engines and the stage graphs (``engines``, ``kernels``) are imported where a stage is
# simulated: serving from cached tables reads this module's signatures alone, and importing
# them costs a serve command a tenth of a second of its start-up.

CYCLE_ENGINE_MAX_PES = 128 * 128
CYCLE_ENGINE_MAX_CYCLES = 20_000_000


@dataclass
class StageRun:
    """One stage's part of a simulated step: its cycles, and where they went."""

    stage: int
    cycles: int  # all tiles through the stage
    first_tile_cycles: int
    busy: np.ndarray  # (h, w) core cycles per PE of the stage
    links: np.ndarray  # (h, w, 4) wavelets sent per direction N, E, S, W
    kernels: dict[str, list[int]]  # kernel name -> [first start, last end]
    kernel_busy: dict[str, int]  # kernel name -> core cycles on its busiest PE
    tasks: int
    messages: int
    reused_from: int | None = None

    def compute_utilization(self) -> float:
        """Core cycles its PEs computed, of their cycles in the stage."""
        return float(self.busy.sum()) / (self.busy.size * self.cycles) if self.cycles else 0

    def link_utilization(self) -> float:
        """Wavelets its links carried, of what they could carry in the stage."""
        return float(self.links.sum()) / (self.links.size * self.cycles) if self.cycles else 0

    def to_json(self) -> dict:
        """Its numbers as ``wse-emu run --json`` lists them (``RegionRun.to_json`` adds the
        layers it holds, seconds and its kernels' bounds): the per-PE counters are not in
        it (``outputs.write_step_outputs`` keeps them in counters.npz)."""
        return {"stage": self.stage, "cycles": self.cycles,
                "first_tile_cycles": self.first_tile_cycles,
                "compute_utilization": self.compute_utilization(),
                "link_utilization": self.link_utilization(),
                "kernel_cycles": {n: span[1] - span[0] for n, span in self.kernels.items()},
                "kernel_busy_cycles": self.kernel_busy, "tasks": self.tasks,
                "messages": self.messages, "reused_from": self.reused_from}

    def __repr__(self) -> str:
        h, w = self.busy.shape
        timed = "" if self.reused_from is None else f", timed as stage {self.reused_from}"
        return (f"StageRun(stage={self.stage}, {self.cycles:,} cycles, {w} x {h} PEs, "
                f"{len(self.kernels)} kernels, compute {self.compute_utilization():.1%}{timed})")


@dataclass
class RegionRun:
    """One prefill or decode step simulated on one region of a program, stage by stage.

    ``to_json()`` is what ``wse-emu run --json`` prints and keeps in results.json; the
    per-PE counters of each stage stay in ``stages`` (``StageRun.busy``, ``StageRun.links``).
    """

    region: str
    engine: str
    step: MicroBatch
    stages: list[StageRun]
    transfers: list[int]  # cycles to move the activation into stage i (0 for the first)
    step_cycles: float
    clock_hz: float
    tokens: int
    wall_seconds: float
    simulated: int  # stages actually simulated (the rest reused)
    extra: dict = field(default_factory=dict)
    program: WaferProgram | None = field(default=None, compare=False)  # what was run
    # Per stage id, each kernel's lower bound in cycles (``compiler.bounds.stage_bounds``:
    # the command line and ``api.run`` give them; the core cannot compute them).
    bounds: dict | None = field(default=None, compare=False)

    @property
    def step_seconds(self) -> float:
        return self.step_cycles / self.clock_hz

    @property
    def bottleneck(self) -> int:
        return int(np.argmax([s.cycles for s in self.stages]))

    def tokens_per_s(self) -> float:
        """With the pipeline full: one micro-batch leaves every slowest-stage time."""
        return self.tokens * self.clock_hz / max(s.cycles for s in self.stages)

    def latency_tokens_per_s(self) -> float:
        """One micro-batch alone: tokens over the step latency."""
        return self.tokens / self.step_seconds

    def compute_utilization(self) -> float:
        busy = sum(float(s.busy.sum()) for s in self.stages)
        capacity = sum(s.busy.size * s.cycles for s in self.stages)
        return busy / capacity if capacity else 0.0

    def link_utilization(self) -> float:
        sent = sum(float(s.links.sum()) for s in self.stages)
        capacity = sum(s.links.size * s.cycles for s in self.stages)
        return sent / capacity if capacity else 0.0

    def describe(self) -> str:
        """'decode of batch 1 at context 4096', 'prefill of 4096 tokens in 4 tiles', with the
        attention tiles a decode step ran in."""
        step = self.step
        if step.phase == "prefill":
            return f"prefill of {step.tokens} tokens in {len(step.tiles())} tiles"
        tile = self.attention_tile()
        return step.describe() + (f", attention in tiles of {tile}" if tile else "")

    def attention_tile(self) -> int | None:
        """Sequences per attention tile of a decode step run with batch tiling on attention."""
        if self.program is None:
            return None
        size = ly.attention_tile_of(self.program.options)
        return size if len(self.step.attention_tiles(size)) > 1 else None

    def experts(self) -> dict | None:
        """How busy a mixture of experts' experts are in the step: the drawn loads of one
        layer (every expert resident, only the routed ones working; ``routing.load_summary``)
        and the share of the step's cycles the expert strips' PEs compute (None for a dense
        model)."""
        program = self._program()
        model = program.model
        if not model.is_moe:
            return None
        loads = load_summary(routing_of(program.options), model.experts.count,
                             model.experts.top_k, self.step.tiles()[0].new_tokens)
        experts = {op.name for op in ly.layer_ops(model) if op.kind == ly.EXPERT_GEMM}
        busy = capacity = 0.0
        for sr in self.stages:
            stage = program.stages[sr.stage]
            for k in program.stage_kernels(stage):
                if k.name in experts:
                    r, st = k.rect, stage.rect
                    busy += float(sr.busy[r.y - st.y:r.y1 - st.y, r.x - st.x:r.x1 - st.x].sum())
                    capacity += r.area * sr.cycles
        return {**loads, "expert_pe_utilization": busy / capacity if capacity else 0.0}

    def compiled_bounds(self) -> dict | None:
        """The bounds the compiler stored for this region and phase (its summary's), when the
        step is the workload they were taken at."""
        program = self._program()
        opts, step = program.options, self.step
        same = (step.phase == "prefill" and step.tokens == opts.bound_prefill_tokens) or (
            step.phase == "decode" and not step.drafted and step.batch == opts.bound_decode_batch
            and step.context == opts.bound_decode_context)
        if not same:
            return None  # the compiler's bounds are for another workload
        return program.summary.get("bounds", {}).get(self.region, {}).get(step.phase)

    def to_json(self) -> dict:
        """What ``wse-emu run --json`` prints and keeps in results.json: the step, its stages
        (with the layers each holds and, beside its kernels, their lower ``bounds``), the
        utilization, and for a mixture of experts its expert loads."""
        program = self._program()
        b = self.bottleneck
        stages = []
        for sr in self.stages:
            stage, own = program.stages[sr.stage], sr.to_json()
            stages.append({
                "stage": sr.stage, "layers": stage.layers, "experts": stage.experts,
                "holds": stage.describe_layers(), "cycles": sr.cycles,
                "seconds": sr.cycles / self.clock_hz,
                **{k: own[k] for k in ("first_tile_cycles", "compute_utilization",
                                       "link_utilization", "kernel_cycles",
                                       "kernel_busy_cycles")},
                # One layer, one token tile.
                "kernel_bound_cycles_each": None if self.bounds is None
                else self.bounds[sr.stage],
                **{k: own[k] for k in ("tasks", "messages", "reused_from")}})
        return {
            "model": program.model.name,
            "cluster": f"{program.systems} x {program.fabric.name}",
            "region": self.region, "engine": self.engine,
            "routing": routing_of(program.options).describe() if program.model.is_moe
            else None,
            "step": {"phase": self.step.phase, "tokens": self.step.tokens,
                     "batch": self.step.batch, "context": self.step.context,
                     "draft_tokens": self.step.drafted,
                     "tiles": len(self.step.tiles()), "attention_tile": self.attention_tile()},
            "experts": self.experts(),
            "step_cycles": self.step_cycles, "step_seconds": self.step_seconds,
            "tokens_per_s_alone": self.latency_tokens_per_s(),
            "tokens_per_s_pipelined": self.tokens_per_s(),
            "bottleneck_stage": self.stages[b].stage, "bottleneck_cycles": self.stages[b].cycles,
            "compiled_bounds": self.compiled_bounds(),
            "compute_utilization": self.compute_utilization(),
            "link_utilization": self.link_utilization(),
            "transfer_cycles": self.transfers,
            "stages": stages, "stages_simulated": self.simulated,
            "wall_seconds": self.wall_seconds,
        }

    def _program(self) -> WaferProgram:
        if self.program is None:
            raise ValueError("this RegionRun does not say which program it ran on "
                             "(run_region sets RegionRun.program)")
        return self.program

    def __repr__(self) -> str:
        return (f"RegionRun(region={self.region!r}, {self.describe()}, {len(self.stages)} "
                f"stages, {seconds(self.step_seconds)}/step, "
                f"{with_unit(self.latency_tokens_per_s(), 'tok/s')} alone, "
                f"{with_unit(self.tokens_per_s(), 'tok/s')} pipelined, bottleneck stage "
                f"{self.stages[self.bottleneck].stage}, {self.engine} engine)")


def signature(program: WaferProgram, stage: Stage) -> tuple:
    r = stage.rect
    kernels = tuple((k.name, k.kind, k.rect.x - r.x, k.rect.y - r.y, k.rect.w, k.rect.h,
                     tuple(k.grid or ()), k.root, tuple(k.matrix or ()), k.weight_ref is None)
                    for k in program.stage_kernels(stage))
    # Layers of one shape can still differ in their attention (Gemma alternates sliding and
    # full layers), which changes their time.
    windows = tuple(program.model.attention.window(i) for i in range(*stage.layers))
    return (r.w, r.h, stage.strip_axis, stage.num_layers, stage.has_embedding, stage.has_head,
            kernels, windows, stage.part)


def execute(graph, fabric, engine: str):
    """(task start, task end, message done, link wavelets) of a graph on an engine, with the
    fabric's latencies, virtual channels and queue depth."""
    from wse_emu.engines import cycle, fast

    hop, ramp = fabric.hop_latency_cycles, fabric.ramp_latency_cycles
    if engine == "fast":
        res = fast.run(graph, hop, ramp, fabric.queue_wavelets)
        return res.task_start, res.task_end, res.msg_done, res.link_wavelets
    if graph.width * graph.height > CYCLE_ENGINE_MAX_PES:
        raise UserError(f"the cycle engine runs stages of up to {CYCLE_ENGINE_MAX_PES:,} PEs;"
                        f" this stage has {graph.width * graph.height:,}: use `engine=fast`")
    vcs, depth = fabric.virtual_channels, fabric.queue_wavelets
    if cycle.queue_bytes(graph.width, graph.height, vcs, depth) > cycle.MAX_QUEUE_BYTES:
        raise UserError(f"the cycle engine's router queues for this stage ({vcs} "
                        f"`virtual_channels` of {depth} `queue_wavelets` on "
                        f"{graph.width * graph.height:,} PEs) exceed "
                        f"{cycle.MAX_QUEUE_BYTES / 2**30:.0f} GiB: lower them or use "
                        "`engine=fast`")
    res = cycle.run_graph(graph, vcs, depth, max(hop, 1), max(ramp, 1), CYCLE_ENGINE_MAX_CYCLES)
    if (res.task_end < 0).any():
        raise UserError(f"the cycle engine stopped at {CYCLE_ENGINE_MAX_CYCLES:,} cycles "
                        "before the stage finished: use `engine=fast`")
    return res.task_start, res.task_end, res.t_done, res.link_wavelets


def makespan_of(end, done) -> int:
    return int(max(end.max(initial=0), done.max(initial=0)))


def simulate_stage(program: WaferProgram, stage: Stage, step: MicroBatch, engine: str) -> StageRun:
    from wse_emu.engines.usage import kernel_usage
    from wse_emu.kernels.stage import stage_graph

    fabric = program.fabric
    graph, finals, names = stage_graph(program, stage, step)
    start, end, done, links = execute(graph, fabric, engine)
    makespan = makespan_of(end, done)
    first = makespan
    tiles = step.tiles()
    if len(tiles) > 1:
        # The first tile's own trip through the stage, as it makes it when it arrives alone
        # (in a pipeline, tiles reach a stage one after another).
        first = stage_cycles(program, stage, tiles[0], engine)
    busy, count, began, ended, busiest = kernel_usage(
        graph.task_kind, graph.task_pe, graph.task_cycles, start, end, len(names),
        graph.width * graph.height)
    spans = {name: [int(began[k]), int(ended[k])] for k, name in enumerate(names) if count[k]}
    kernel_busy = {name: int(busiest[k]) for k, name in enumerate(names) if count[k]}
    return StageRun(stage.id, makespan, first, busy.reshape(graph.height, graph.width),
                    links.reshape(graph.height, graph.width, 4), spans, kernel_busy,
                    graph.tasks, len(graph.msgs))


def stage_cycles(program: WaferProgram, stage: Stage, step: MicroBatch, engine: str,
                 on_forms: bool = False) -> int:
    """The cycles ``step`` takes through ``stage`` on ``engine``, and nothing else
    (``on_forms``: its graph built as ``kernels.stage.stage_graph`` says, for a caller timing
    shape after shape)."""
    from wse_emu.kernels.stage import stage_graph

    graph, _, _ = stage_graph(program, stage, step, on_forms)
    return makespan_of(*execute(graph, program.fabric, engine)[1:3])


def kernel_cycles(program: WaferProgram, stage: Stage, name: str, step: MicroBatch,
                  engine: str) -> int:
    """The cycles kernel ``name`` of ``stage`` takes for ``step`` alone, its inputs present at
    its start (``kernel_graph``)."""
    from wse_emu.kernels.stage import kernel_graph

    graph = kernel_graph(program, stage, name, step)
    return makespan_of(*execute(graph, program.fabric, engine)[1:3])


def transfer_cycles(program: WaferProgram, a: Stage, b: Stage, tokens: int) -> int:
    """The residual stream from one stage's home line to the next, on parallel lanes (after
    a split layer's first part, with what its second part needs: ``layer.carried_values``)."""
    fabric, model = program.fabric, program.model
    home = [k for k in program.stage_kernels(a)
            if k.name in (ly.home_site(model), "lm_head")][0]
    lanes = home.grid[1]
    values = ly.carried_values(model, a.part)
    return trip_cycles(fabric, (a.rect.system, *a.rect.center()),
                       (b.rect.system, *b.rect.center()), values, lanes, tokens,
                       model.storage.dtype_bytes)


def trip_cycles(fabric, a: tuple, b: tuple, values: int, lanes: int, tokens: int,
                dtype_bytes: int) -> int:
    """``values`` per token of ``tokens`` from point ``a`` to ``b`` (system, x, y) on
    ``lanes`` parallel lanes: off the wafer and onto another at the link's rate, else hop by
    hop with the longest lane's wavelets streaming behind its head."""
    from wse_emu.kernels.primitives import wavelets

    if a[0] != b[0]:
        nbytes = values * tokens * dtype_bytes
        return int(2 * fabric.ramp_latency_cycles + np.ceil(nbytes /
                                                              fabric.offwafer_bytes_per_cycle()))
    seg = int(wavelets(even_split(values, lanes).max() * tokens, dtype_bytes))
    hops = int(abs(a[1] - b[1]) + abs(a[2] - b[2]))
    return hops * fabric.hop_latency_cycles + 2 * fabric.ramp_latency_cycles + seg - 1


DEFAULT_PREFILL_TILES = 4  # a prefill step's token tiles, as the command line and the API take it
MAX_PREFILL_TILES = 128
# Drafted tokens a verify step checks per sequence, at most (published drafts propose up to
# about ten; a larger count is more likely a slip than a plan).
MAX_DRAFTED = 16
ENGINES = ("fast", "cycle")


def check_step(phase: str, *, batch: int, context: int, tokens: int, tiles: int,
               engine: str = "fast", draft_tokens: int = 0) -> None:
    """A step's arguments by name and range, whichever phase reads them, before any program
    is needed (a sweep checks its points' before compiling any). What the model and the
    program bound (positions, KV room) is checked where the step is made: a sweep keeps such
    a point's row, with why, as it keeps a point whose model does not fit."""
    one_of("phase", phase, ("prefill", "decode"))
    one_of("engine", engine, ENGINES)
    for name, value in (("batch", batch), ("context", context), ("tokens", tokens),
                        ("tiles", tiles)):
        whole(name, value, 1)
    if tiles > MAX_PREFILL_TILES:
        raise UserError(f"`tiles` must be at most {MAX_PREFILL_TILES}, got {tiles}")
    whole("draft_tokens", draft_tokens, 0)
    if draft_tokens > MAX_DRAFTED:
        raise UserError(f"`draft_tokens` must be at most {MAX_DRAFTED}, got "
                        f"{draft_tokens}")
    if draft_tokens and phase != "decode":
        raise UserError("drafted tokens are verified in a decode step: give `phase=decode` "
                        "with `draft_tokens`")


def step_for(program: WaferProgram, phase: str, region: str | None = None, *, batch: int = 1,
             context: int = 4096, tokens: int = 4096, tiles: int = DEFAULT_PREFILL_TILES,
             draft_tokens: int = 0) -> tuple[str, MicroBatch]:
    """The region (by default the first that serves ``phase``) and the step to simulate on
    it: a decode of ``batch`` sequences at ``context`` each (with ``draft_tokens`` drafted
    tokens each to verify after the next), or a prefill of ``tokens`` in ``tiles`` tiles;
    checked, by name, against the region's KV capacity."""
    check_step(phase, batch=batch, context=context, tokens=tokens, tiles=tiles,
               draft_tokens=draft_tokens)
    if region is not None and not isinstance(region, str):
        raise UserError(f"the region must be given by its name, got {short_repr(region)}")
    name = program.region_for(phase, region).name
    capacity = program.region(name).kv_capacity_tokens
    if phase == "prefill":
        if tokens > capacity:
            raise UserError(f"a prompt of {tokens:,} tokens does not fit the KV cache of region "
                            f"{name} ({capacity:,} tokens)")
        return name, MicroBatch("prefill", tokens=tokens, chunks=min(tiles, tokens))
    held = batch * (context + draft_tokens)
    if held > capacity:
        what = f"`context={context}`" if not draft_tokens else \
            f"(`context={context}` + `draft_tokens={draft_tokens}`)"
        raise UserError(f"`batch={batch}` x {what} = {held:,} cached tokens do not fit the KV "
                        f"cache of region {name} ({capacity:,} tokens)")
    return name, MicroBatch("decode", batch=batch, context=context,
                            drafted=draft_tokens)


def run_region(program: WaferProgram, region_name: str, step: MicroBatch, engine: str = "fast",
               reuse: bool = True, progress=None, threads: int | None = None) -> RegionRun:
    """One step on one region; its distinct stages are timed on ``threads`` threads (by
    default one per core)."""
    if engine not in ("fast", "cycle"):
        raise UserError(f"`engine` must be fast or cycle, got {engine!r}")
    region = program.region(region_name)
    stages = [program.stages[i] for i in region.stage_ids]
    began = time.perf_counter()
    keys = [signature(program, st) if reuse else (st.id,) for st in stages]
    first_of: dict[tuple, Stage] = {}
    for key, stage in zip(keys, stages):
        first_of.setdefault(key, stage)
    # Distinct stages are independent: time them on parallel threads (the engine releases
    # the GIL), largest first so that the longest (the LM head's) does not start last, then
    # hand each stage its shape's result.
    done: dict[tuple, StageRun] = {}
    workers = min(len(first_of), threads or os.cpu_count() or 1)
    largest_first = sorted(first_of.items(), key=lambda item: -item[1].rect.w * item[1].rect.h)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {key: pool.submit(simulate_stage, program, stage, step, engine)
                   for key, stage in largest_first}
        for i, (key, future) in enumerate(futures.items()):
            done[key] = future.result()
            if progress:
                progress(i + 1, len(futures))
    runs: list[StageRun] = []
    for key, stage in zip(keys, stages):
        base = done[key]
        if base.stage == stage.id:
            runs.append(base)
        else:
            runs.append(StageRun(stage.id, base.cycles, base.first_tile_cycles, base.busy,
                                 base.links, base.kernels, base.kernel_busy, base.tasks,
                                 base.messages, reused_from=base.stage))
    simulated = len(done)
    transfers, extra = region_transfers(program, stages, step, engine)
    tiles = len(step.tiles())
    if tiles > 1:
        periods = [(r.cycles - r.first_tile_cycles) / (tiles - 1) for r in runs]
        step_cycles = sum(r.first_tile_cycles for r in runs) + sum(transfers) \
            + (tiles - 1) * max(periods)
    else:
        step_cycles = float(sum(r.cycles for r in runs) + sum(transfers))
    return RegionRun(region_name, engine, step, runs, transfers, float(step_cycles),
                     program.fabric.clock_hz, step.new_tokens,
                     time.perf_counter() - began, simulated, extra, program=program)


def region_transfers(program: WaferProgram, stages: list[Stage], step: MicroBatch,
                     engine: str = "fast") -> tuple[list, dict]:
    """The cycles of a step's first tile from each stage of a pipeline to the next (the
    first entry: what comes before the first stage, nothing unless the embeddings are tied),
    and, with tied embeddings, the lookup's own cycles and its trip to the first stage."""
    tile = step.tiles()[0].new_tokens
    transfers = [0] + [transfer_cycles(program, a, b, tile)
                       for a, b in zip(stages, stages[1:])]
    extra = {}
    if program.model.tie_embeddings:
        # The table lives in the LM head of the last stage: the lookup runs there and its
        # output travels to the first stage before the first stage can start.
        extra["embedding_cycles"] = kernel_cycles(program, stages[-1], "embedding",
                                                  step.tiles()[0], engine)
        extra["embedding_transfer_cycles"] = transfer_cycles(program, stages[-1], stages[0],
                                                             tile)
        transfers[0] = extra["embedding_cycles"] + extra["embedding_transfer_cycles"]
    return transfers, extra


@dataclass
class HandoffRun:
    """A prompt's KV cache moved from a prefill region to a decode region."""

    prefill_region: str
    decode_region: str
    tokens: int
    cycles: int
    clock_hz: float
    kv_bytes: int
    offwafer: bool
    messages: int
    links: np.ndarray | None  # (systems, h, w, 4) wavelets, for an on-wafer handoff
    model: str = ""  # the model whose KV it is

    @property
    def seconds(self) -> float:
        return self.cycles / self.clock_hz

    def to_json(self) -> dict:
        """What ``wse-emu run --phase handoff --json`` prints and keeps in results.json (the
        per-link counts stay in counters.npz)."""
        return {"model": self.model, "prefill_region": self.prefill_region,
                "decode_region": self.decode_region, "tokens": self.tokens,
                "kv_bytes": self.kv_bytes, "cycles": self.cycles, "seconds": self.seconds,
                "bytes_per_s": self.kv_bytes / self.seconds, "offwafer": self.offwafer,
                "messages": self.messages}

    def __repr__(self) -> str:
        route = "off-wafer" if self.offwafer else "on-wafer"
        return (f"HandoffRun({self.prefill_region!r} -> {self.decode_region!r}, KV of "
                f"{self.tokens:,} tokens, {self.kv_bytes / 1e6:.1f} MB {route}, "
                f"{self.cycles:,} cycles = {seconds(self.seconds)})")


def handoff_for(program: WaferProgram, region: str | None, tokens: int) -> tuple[str, str]:
    """The prefill region (``region``, by default the first) whose KV a ``tokens``-long prompt
    moves from, and the decode region it moves to, checked by name."""
    whole("tokens", tokens, 1)
    roles = {r.role: r.name for r in reversed(program.regions)}
    if "prefill" not in roles or "decode" not in roles:
        raise UserError("a handoff needs a disaggregated program (compile with "
                        "`plan=disaggregated`)")
    src = program.region(region).name if region else roles["prefill"]
    if program.region(src).role != "prefill":
        raise UserError(f"region {src} is a {program.region(src).role} region; the handoff "
                        "starts from a prefill region")
    if tokens > program.region(roles["decode"]).kv_capacity_tokens:
        raise UserError(f"a prompt of {tokens:,} tokens does not fit the KV cache of region "
                        f"{roles['decode']}")
    return src, roles["decode"]


def kv_handoff(program: WaferProgram, prefill_region: str, decode_region: str,
               tokens: int) -> HandoffRun:
    """Move the KV cache of a ``tokens``-long prompt from a prefill region to a decode region:
    each prefill stage sends its layers' K and V to the decode stage holding the same layers,
    every row across the stage carrying its share, all stages at once over the shared fabric
    (fast engine, whole wafer) or, between systems, over the off-wafer link."""
    from wse_emu.engines import fast
    from wse_emu.engines.messages import UNICAST
    from wse_emu.kernels.graph import GraphBuilder
    from wse_emu.kernels.primitives import wavelets

    fabric, model = program.fabric, program.model
    src_region, dst_region = program.region(prefill_region), program.region(decode_region)
    by_layers = {tuple(program.stages[i].layers): program.stages[i]
                 for i in dst_region.stage_ids if program.stages[i].has_attention}
    per_token = 2 * model.attention.kv_size * model.storage.dtype_bytes
    total = tokens * model.num_layers * per_token
    src_systems = {p.system for p in src_region.parts}
    dst_systems = {p.system for p in dst_region.parts}
    if src_systems != dst_systems or len(src_systems) > 1:
        cycles = int(np.ceil(total / fabric.offwafer_bytes_per_cycle())) \
            + 2 * fabric.ramp_latency_cycles
        return HandoffRun(prefill_region, decode_region, tokens, cycles, fabric.clock_hz, total,
                          True, 0, None, model.name)
    system = next(iter(src_systems))
    g = GraphBuilder(fabric.width, fabric.height)
    for i in src_region.stage_ids:
        a = program.stages[i]
        if not a.has_attention:  # a split layer's second part keeps no KV
            continue
        b = by_layers.get(tuple(a.layers))
        if b is None:
            raise UserError(f"regions {prefill_region} and {decode_region} stage their layers "
                            "differently; compile both roles with the same `layers_per_stage`")
        # The KV is spread over all of a stage's PEs: it leaves along the stage's rows (the
        # direction that crosses between regions placed side by side), one lane per row,
        # keeping its row where the two stages share rows.
        rows = min(a.rect.h, b.rect.h)
        share = even_split(tokens * a.num_layers * per_token, rows)
        idx = np.arange(rows)
        ya = a.rect.y + (idx * a.rect.h) // rows
        yb = np.where((ya >= b.rect.y) & (ya < b.rect.y1), ya,
                      b.rect.y + (idx * b.rect.h) // rows)
        src = g.pe(np.full(rows, a.rect.x + a.rect.w // 2), ya)
        dst = g.pe(np.full(rows, b.rect.x + b.rect.w // 2), yb)
        senders = g.tasks(src, 0, 0)
        receivers = g.tasks(dst, 0, 0)
        g.send(senders, src, dst, wavelets(share, 1), receivers, UNICAST, 3)
    graph = g.build()
    res = fast.run(graph, fabric.hop_latency_cycles, fabric.ramp_latency_cycles,
                   fabric.queue_wavelets)
    links = np.zeros((program.systems, fabric.height, fabric.width, 4), dtype=np.int64)
    links[system] = res.link_wavelets.reshape(fabric.height, fabric.width, 4)
    cycles = int(max(res.task_end.max(), res.msg_done.max()))
    return HandoffRun(prefill_region, decode_region, tokens, cycles, fabric.clock_hz, total,
                      False, len(graph.msgs), links, model.name)
