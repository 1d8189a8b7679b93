"""A sweep's points, each a cluster compiled and a step timed (``run``) or a workload served
(``serve``): what a point may set, every point's settings checked by name before the first
runs (``check_sweep``), and one point run (``evaluate_point``, a job for the sweep's
workers)."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

from wse_emu.compiler.mapper import compile_model
from wse_emu.compiler.options import compile_options, parse_region
from wse_emu.errors import UserError
from wse_emu.hardware.fabric import ClusterSpec, FabricSpec, with_overrides
from wse_emu.hardware.fabric import load_fabric as fabric_file
from wse_emu.models.load import load_model as model_file
from wse_emu.models.spec import stored_as
from wse_emu.pools.serve import Demand, check_serving, serve_program
from wse_emu.serving.serve import setting_names
from wse_emu.serving.tables import default_cache_dir
from wse_emu.sim.runner import DEFAULT_PREFILL_TILES, check_step
from wse_emu.sim.steps import run_step
from wse_emu.sweeps.sweep import check_size, claim_directory, run_sweep
from wse_emu.util.checks import of_type, short_repr, whole
from wse_emu.util.workers import check_workers, point_pool

# What a sweep point may set, beyond "fabric.FIELD" overrides of the fabric's parameters.
CLUSTER_SETTINGS = ("model", "fabric", "systems", "plan", "prefill_share", "prefill_systems",
                    "region", "layers_per_stage", "routing", "routing_seed", "attention_tile",
                    "weight_format", "expert_weight_format")
# Those of them that are compile options (region aside: a point may write it WxH).
COMPILED_SETTINGS = ("plan", "prefill_share", "prefill_systems", "layers_per_stage", "routing",
                     "routing_seed", "attention_tile")
RUN_DEFAULTS = {"phase": "decode", "batch": 1, "context": 4096, "tokens": 4096,
                "tiles": DEFAULT_PREFILL_TILES, "engine": "fast"}
POINT_SETTINGS = {"run": ("phase", "batch", "context", "tokens", "tiles", "engine"),
                  "serve": ("workload", "rate", "requests", "ttft_s", "tpot_s", "cache_dir",
                            *(name for name in setting_names() if name != "timeline_events"))}


def check_sweep(spec) -> None:
    """Every setting a sweep's points take (a SweepSpec's base and axes), checked by name
    before the first point runs: a name no point takes would fail at every point; then
    every point's values (``point_plan``), nothing compiled."""
    allowed = CLUSTER_SETTINGS + POINT_SETTINGS[spec.point]
    fabric_fields = sorted(f.name for f in fields(FabricSpec) if f.name != "name")
    for name in [*spec.base, *spec.axes]:
        if not isinstance(name, str):
            raise UserError(f"sweep {spec.name}: setting {short_repr(name)} is not a name")
        if name.startswith("fabric."):
            if name.split(".", 1)[1] not in fabric_fields:
                raise UserError(f"sweep {spec.name}: the fabric has no field "
                                f"{short_repr(name.split('.', 1)[1])} (its fields: "
                                f"{', '.join(fabric_fields)})")
        elif name not in allowed:
            raise UserError(f"sweep {spec.name}: a {spec.point} point does not take "
                            f"{short_repr(name)} (it takes {', '.join(allowed)}, and fabric.FIELD)")
    # Every point's values too: one every point would refuse (a batch of "8", a region of
    # 8xq) would otherwise be found at each point in turn, after its compile.
    loaded: dict = {}
    for config in spec.points():
        try:
            point_plan(spec.point, config, loaded)
        except UserError as exc:
            at = {k: config[k] for k in spec.axes}
            raise UserError(f"sweep {spec.name}, point {short_repr(at, 80)}: "
                            f"{' '.join(str(exc).split())}") from None


def point_plan(point: str, config: dict, loaded: dict | None = None) -> tuple:
    """What one sweep point (see ``wse_emu.sweeps.sweep``) runs, every setting checked by
    name and nothing compiled: the model as stored, the cluster, the compile options, and the
    arguments of ``run`` or ``serve`` besides the program. ``loaded``: the models and fabrics
    read so far, by name (``check_sweep`` reads each once for all the points)."""
    unknown = sorted(k for k in config if k not in CLUSTER_SETTINGS + POINT_SETTINGS[point]
                     and not k.startswith("fabric."))
    if unknown:
        raise UserError(f"a {point} point does not take {', '.join(unknown)}")
    if "model" not in config:
        raise UserError("a sweep point needs a model")
    loaded = {} if loaded is None else loaded

    def read(what: str, name, reader):
        key = (what, str(of_type(what, name, Path | str)))
        if key not in loaded:
            loaded[key] = reader(name)
        return loaded[key]
    model = stored_as(read("model", config["model"], model_file), config.get("weight_format"),
                      config.get("expert_weight_format"))
    fabric = read("fabric", config.get("fabric", "wse3"), fabric_file)
    overrides = {k.split(".", 1)[1]: v for k, v in config.items() if k.startswith("fabric.")}
    if overrides:
        fabric = with_overrides(fabric, **overrides)
    region = config.get("region")
    if isinstance(region, str):
        region = parse_region(region)
    elif isinstance(region, list):  # as YAML writes a pair
        region = tuple(region)
    options = compile_options(region=region, **{k: config[k] for k in COMPILED_SETTINGS
                                                if k in config})
    cluster = ClusterSpec(fabric, whole("systems", config.get("systems", 1), 1))
    if point == "run":
        args = {name: config.get(name, default) for name, default in RUN_DEFAULTS.items()}
        check_step(**args)
        return model, cluster, options, args
    if "workload" not in config:
        raise UserError("a serve point needs a workload")
    knobs = {k: config[k] for k in setting_names() if k in config}
    demand = Demand(config["workload"], **{k: config.get(k) for k in ("rate", "requests",
                                                                     "ttft_s", "tpot_s")})
    check_serving(demand, **knobs)
    default_cache_dir(config.get("cache_dir"))
    return model, cluster, options, {"demand": demand, "cache_dir": config.get("cache_dir"),
                                     **knobs}


def evaluate_point(point: str, config: dict) -> dict:
    """One sweep point (see ``wse_emu.sweeps.sweep``): compile the cluster ``config``
    describes, then time one step (``run``) or serve a workload (``serve``); the numbers the
    commands print. A setting it does not know, or a value it refuses, is refused by name
    before the compile (``point_plan``)."""
    model, cluster, options, args = point_plan(point, config)
    program = compile_model(model, cluster, options)
    if point == "run":
        step = run_step(program, **args)
        # The cluster's regions for this phase are replicas of the region timed, each with
        # its own pipeline; the compiler cuts them from the wafer evenly, so they differ by at
        # most one row or column of PEs, and each is counted at the timed one's rate.
        phase = args["phase"]
        replicas = sum(r.role in (phase, "mixed") for r in program.regions)
        out = {"region": step.region, "step_seconds": step.step_seconds,
               "tokens_per_s_alone": step.latency_tokens_per_s(),
               "tokens_per_s_pipelined": step.tokens_per_s(), "replicas": replicas,
               "tokens_per_s_cluster": replicas * step.tokens_per_s(),
               "compute_utilization": step.compute_utilization()}
        if program.model.is_moe:
            out["expert_pe_utilization"] = step.experts()["expert_pe_utilization"]
        return out
    reported = serve_program(program, **args).metrics.to_json()  # as serve --json prints them
    return {k: reported[k] for k in ("requests", "output_tokens_per_s", "requests_per_s",
                                     "slo_attainment", "goodput_requests_per_s", "ttft_s",
                                     "tpot_s", "itl_s")}


def run_points(spec, output: Path | str | None, scheduler: str | None, workers: int,
               max_points: int | None, progress) -> tuple[Path, list]:
    """Every point of ``spec`` (a SweepSpec) not yet in ``output`` (by default a folder named
    after the sweep), on ``workers`` local processes or a dask cluster (``scheduler``);
    ``progress(done, total)`` after each point. Before the first point: every setting checked
    by name (``check_sweep``), the size against ``max_points`` (by default ``MAX_POINTS``),
    and the folder created or refused. Returns the folder and every row, in the order of the
    sweep's points."""
    check_workers(workers)
    if max_points is not None:
        whole("max_points", max_points, 1)
    check_size(spec, max_points)
    check_sweep(spec)
    out = Path(output if output is not None else spec.name)
    claim_directory(spec, out)
    with point_pool(scheduler, workers) as pool:
        return out, run_sweep(spec, out, pool, evaluate_point, progress, max_points)
