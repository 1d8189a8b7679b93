"""The Python face of wse-emu: what the command line does, as functions returning the objects
it prints. It wires the compiler, the emulated hardware, the serving runtime and the figures
together, as the command line does (the rest of ``wse_emu`` imports neither the compiler nor
the figures).

    from wse_emu import api
    program = api.compile("llama-3.1-8b", "wse3")
    step = api.run(program, "decode", batch=1, context=4096)
    print(f"{step.step_seconds * 1e6:.0f} us per token")

Errors in the inputs raise ``wse_emu.errors.UserError`` (the command line prints them as one
line and exits with 2).
"""

from __future__ import annotations

from pathlib import Path

from compiler.mapper import compile_model
from compiler.options import CompileOptions
from compiler.partition import disaggregated_splits, wafers_needed
from wse_emu.errors import CompileError, UserError
from wse_emu.fabric import ClusterSpec, FabricSpec, load_fabric, with_overrides
from wse_emu.layer import MicroBatch
from wse_emu.model import ModelSpec, load_model, stored_as
from wse_emu.outputs import experts_summary
from wse_emu.program import WaferProgram
from wse_emu.routing import Routing
from wse_emu.runner import RegionRun, run_region
from wse_emu.runtime.comparison import (
    Space,
    describe_draws,
    disagg_experiment,
    longer_draws,
    workload_draws,
)
from wse_emu.runtime.experiment import Targets
from wse_emu.runtime.metrics import run_metrics
from wse_emu.runtime.pool import point_pool
from wse_emu.runtime.regions import region_models
from wse_emu.runtime.serve import ServeOptions, ServeResult, kv_shortfall
from wse_emu.runtime.serve import serve as serve_requests
from wse_emu.runtime.tuning import Layout
from wse_emu.runtime.workload import Requests, WorkloadSpec, load_workload
from wse_emu.runtime.workload import generate as generate_requests

__all__ = ["load_model", "load_fabric", "compile", "run", "serve", "experiment", "generate",
           "draw", "Space", "Targets", "default_cache_dir"]


def default_cache_dir(given: Path | str | None = None) -> Path:
    """Where stage-time tables are kept: ``given``, else the user's cache directory."""
    import os

    if given:
        return Path(given)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "wse-emu"


def _model(model: ModelSpec | str) -> ModelSpec:
    return model if isinstance(model, ModelSpec) else load_model(model)


def _fabric(fabric: FabricSpec | str) -> FabricSpec:
    return fabric if isinstance(fabric, FabricSpec) else load_fabric(fabric)


def compile(model: ModelSpec | str, fabric: FabricSpec | str = "wse3", systems: int = 1, *,
            weight_format: str | None = None, expert_weight_format: str | None = None,
            **options) -> WaferProgram:
    """Compile ``model`` (a preset, a model YAML or a Hugging Face config.json) onto
    ``systems`` wafers of ``fabric``, its weight matrices (and separately its experts') stored
    as ``weight_format`` (``expert_weight_format``) when given; ``options`` are
    ``compiler.options.CompileOptions`` fields (plan="disaggregated", region=(w, h),
    layers_per_stage=...)."""
    spec = stored_as(_model(model), weight_format, expert_weight_format)
    return compile_model(spec, ClusterSpec(_fabric(fabric), systems), CompileOptions(**options))


def run(program: WaferProgram, phase: str = "decode", *, batch: int = 1, context: int = 4096,
        tokens: int = 4096, tiles: int = 1, region: str | None = None,
        engine: str = "fast") -> RegionRun:
    """Simulate one step of ``phase`` on a region of ``program`` (by default the first that
    serves the phase): decode ``batch`` sequences at ``context``, or prefill ``tokens`` in
    ``tiles`` tiles."""
    name = program.region_for(phase, region).name
    capacity = program.region(name).kv_capacity_tokens
    cached = batch * context if phase == "decode" else tokens
    if cached > capacity:
        raise UserError(f"{cached:,} cached tokens do not fit the KV cache of region {name} "
                        f"({capacity:,} tokens)")
    step = (MicroBatch("decode", batch=batch, context=context) if phase == "decode"
            else MicroBatch("prefill", tokens=tokens, chunks=min(tiles, tokens)))
    return run_region(program, name, step, engine)


def serve(program: WaferProgram, workload: WorkloadSpec | str, *,
          cache_dir: Path | str | None = None, ttft_s: float | None = None,
          tpot_s: float | None = None, **options) -> tuple[ServeResult, dict]:
    """Serve a workload (a preset, a YAML or a WorkloadSpec) on ``program``; ``options`` are
    ``ServeOptions`` fields (policy, prefill_tile, batch_limit, ...). Returns the per-request
    result and the metrics the command line prints (with the targets, the attainment)."""
    spec = workload if isinstance(workload, WorkloadSpec) else load_workload(workload)
    requests = generate_requests(spec)
    short = kv_shortfall(requests, program.regions)
    if short:
        raise UserError(short)
    regions = region_models(program, default_cache_dir(cache_dir))
    settings = ServeOptions.of(program.fabric, program.model, **options)
    result = serve_requests(requests, regions, settings)
    return result, run_metrics(result, requests, ttft_s, tpot_s)


def experiment(model: ModelSpec | str, workload: WorkloadSpec | str, *, ttft_s: float,
               tpot_s: float, fabric: FabricSpec | str = "wse3", systems: int = 1,
               space: Space = Space(), seeds: int = 1, attainment: float = 0.9,
               workers: int = 1, cache_dir: Path | str | None = None,
               progress=None, routing: Routing = Routing(), attention_tile: int = 0) -> dict:
    """Colocated against disaggregated serving of ``workload``: both plans tuned, each plan's
    best confirmed on long runs, over ``seeds`` draws; the report ``experiment disagg --json``
    prints. ``workers``: local worker processes (1: run here; 0: one per core). Without dask
    they are started fresh, so a script calling this with ``workers`` other than 1 needs the
    usual ``if __name__ == "__main__":`` guard. ``routing`` and ``attention_tile`` (batch
    tiling on attention) apply to both plans alike."""
    model = _model(model)
    cluster = ClusterSpec(_fabric(fabric), systems)
    spec = workload if isinstance(workload, WorkloadSpec) else load_workload(workload)
    draws = workload_draws(spec, seeds)
    cache = default_cache_dir(cache_dir)
    with point_pool(None, workers) as pool:
        data, _ = disagg_experiment(
            model, cluster, spec.name, draws[0], Targets(ttft_s, tpot_s, attainment), pool,
            lambda probes: build_layouts(model, cluster, probes, cache, space.copies, progress,
                                         grid=space.grid, routing=routing,
                                         attention_tile=attention_tile),
            space, progress=progress, more_draws=draws[1:],
            longer=longer_draws(spec, seeds))
    if seeds > 1:
        data["over_replicates"]["draws"] = describe_draws(spec, data)
    return data


def generate(program: WaferProgram, prompt_ids: list[int], new_tokens: int = 8, *,
             checkpoint: Path | str | None = None, weights_seed: int = 0):
    """Greedy generation computed through ``program``'s tiles, with a checkpoint's weights
    (a directory of config.json and *.safetensors) or random ones drawn from ``weights_seed``;
    returns the generator's result (``generated_ids``, the regions used)."""
    from wse_emu.functional.generate import Generator
    from wse_emu.weights import check_memory, load_checkpoint, random_weights

    check_memory(program.model)
    if checkpoint is not None:
        _, weights = load_checkpoint(Path(checkpoint))
    else:
        weights = random_weights(program.model, weights_seed)
    return Generator(program, weights).generate(list(prompt_ids), new_tokens)


# What a sweep point may set, beyond "fabric.FIELD" overrides of the fabric's parameters.
CLUSTER_SETTINGS = ("model", "fabric", "systems", "plan", "prefill_share", "prefill_systems",
                    "region", "layers_per_stage", "routing", "routing_seed", "attention_tile",
                    "weight_format", "expert_weight_format")
POINT_SETTINGS = {"run": ("phase", "batch", "context", "tokens", "tiles", "engine"),
                  "serve": ("workload", "rate", "requests", "policy", "prefill_tile",
                            "token_budget", "batch_limit", "max_running", "interleave",
                            "prefix_cache", "ttft_s", "tpot_s", "cache_dir")}


def evaluate_point(point: str, config: dict) -> dict:
    """One sweep point (see ``wse_emu.runtime.sweep``): compile the cluster ``config``
    describes, then time one step (``run``) or serve a workload (``serve``); the numbers the
    commands print. A setting it does not know is refused by name."""
    unknown = sorted(k for k in config if k not in CLUSTER_SETTINGS + POINT_SETTINGS[point]
                     and not k.startswith("fabric."))
    if unknown:
        raise UserError(f"a {point} point does not take {', '.join(unknown)}")
    if "model" not in config:
        raise UserError("a sweep point needs a model")
    fabric = _fabric(config.get("fabric", "wse3"))
    overrides = {k.split(".", 1)[1]: v for k, v in config.items() if k.startswith("fabric.")}
    if overrides:
        fabric = with_overrides(fabric, **overrides)
    region = config.get("region")
    if isinstance(region, str):
        w, _, h = region.partition("x")
        region = (int(w), int(h))
    program = compile(config["model"], fabric, config.get("systems", 1),
                      **{k: config[k] for k in ("plan", "prefill_share", "prefill_systems",
                                                "layers_per_stage", "routing", "routing_seed",
                                                "attention_tile", "weight_format",
                                                "expert_weight_format") if k in config},
                      region=tuple(region) if region else None)
    if point == "run":
        step = run(program, config.get("phase", "decode"), batch=config.get("batch", 1),
                   context=config.get("context", 4096), tokens=config.get("tokens", 4096),
                   tiles=config.get("tiles", 1), engine=config.get("engine", "fast"))
        # The cluster's regions for this phase are replicas of the region timed, each with
        # its own pipeline; the compiler cuts them from the wafer evenly, so they differ by at
        # most one row or column of PEs, and each is counted at the timed one's rate.
        phase = config.get("phase", "decode")
        replicas = sum(r.role in (phase, "mixed") for r in program.regions)
        out = {"region": step.region, "step_seconds": step.step_seconds,
               "tokens_per_s_alone": step.latency_tokens_per_s(),
               "tokens_per_s_pipelined": step.tokens_per_s(), "replicas": replicas,
               "tokens_per_s_cluster": replicas * step.tokens_per_s(),
               "compute_utilization": step.compute_utilization()}
        if program.model.is_moe:
            out["expert_pe_utilization"] = experts_summary(program, step)[
                "expert_pe_utilization"]
        return out
    spec = load_workload(config["workload"])
    if "rate" in config:
        spec.rate = float(config["rate"])
    if "requests" in config:
        spec.requests = int(config["requests"])
    knobs = {k: config[k] for k in ("policy", "prefill_tile", "token_budget", "batch_limit",
                                    "max_running", "interleave", "prefix_cache") if k in config}
    _, metrics = serve(program, spec, cache_dir=config.get("cache_dir"),
                       ttft_s=config.get("ttft_s"), tpot_s=config.get("tpot_s"), **knobs)
    return {k: metrics[k] for k in ("requests", "output_tokens_per_s", "requests_per_s",
                                    "slo_attainment", "goodput_requests_per_s", "ttft_s",
                                    "tpot_s", "itl_s")}


def draw(run_dir: Path | str, what=("maps", "roofline", "serving", "experiment")) -> Path:
    """Draw a run directory's figures and report.html; returns the report's path."""
    from visualize.rundraw import draw_run

    return draw_run(Path(run_dir), what)


def build_layouts(model: ModelSpec, cluster: ClusterSpec, probes: list[Requests], cache: Path,
                  copies=(1,), progress=None, splits: list[dict] | None = None,
                  grid: str = "full", routing: Routing = Routing(),
                  attention_tile: int = 0) -> tuple[dict, list[str]]:
    """Every layout to tune: colocated with each number of ``copies`` of the model per wafer
    (side by side in column bands), and disaggregated at each of ``splits`` (by default every
    split ``disaggregated_splits`` proposes). A layout that does not compile, or whose regions
    cannot hold the KV cache of the longest request of any of ``probes`` (every set of
    requests the experiment may serve), is skipped, with why (colocated with one copy must
    compile). Stage tables are timed over ``grid``'s shapes. Returns (plan, name) -> Layout,
    and the skipped."""
    fabric = cluster.fabric
    splits = disaggregated_splits(model, cluster) if splits is None else splits
    span = wafers_needed(model, fabric)
    if not splits:
        raise UserError(f"{model.name} spans {span} x {fabric.name} per replica, so "
                        f"{cluster.systems} system(s) leave no prefill/decode split to compare: "
                        f"it needs {2 * span} systems or more")
    plans, skipped = [], []
    for n in sorted(set(copies) | {1}):
        name = f"{n} cop{'y' if n == 1 else 'ies'}"
        if n == 1:
            plans.append(("colocated", name, {}))
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
    layouts = {}
    for plan, name, split in plans:
        if progress:
            progress(f"compiling and timing {plan} {name}")
        try:
            program = compile_model(model, cluster, CompileOptions(
                plan=plan, routing=routing.spec(), routing_seed=routing.seed,
                attention_tile=attention_tile, **split))
        except CompileError as exc:
            if plan == "colocated" and not split:
                raise
            skipped.append(f"{plan} {name}: {' '.join(str(exc).split())}")
            continue
        short = next(filter(None, (kv_shortfall(r, program.regions) for r in probes)), None)
        if short:
            skipped.append(f"{plan} {name}: {short}")
            continue
        layouts[(plan, name)] = Layout(plan, name, region_models(program, cache, grid=grid))
    if not any(plan == "disaggregated" for plan, _ in layouts):
        raise UserError("no disaggregated split holds the longest request's KV cache: "
                        + "; ".join(skipped))
    return layouts, skipped
