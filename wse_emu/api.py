"""The Python face of wse-emu: what the command line does, as functions returning the reports
it prints. Each is one call into the packages below (the command line calls the same ones), so
this module holds no logic of its own beyond checking arguments against their annotations.

    from wse_emu import api
    program = api.compile("llama-3.1-8b", "wse3")
    step = api.run(program, "decode", batch=1, context=4096)
    print(f"{step.step_seconds * 1e6:.0f} us per token")

An experiment is described by objects (``ExperimentSpec``, ``FrontierSpec``, ``PairingsSpec``
and their parts, ``wse_emu.experiments.spec``), each checked when it is made; ``from_flat``
makes one from its fields' names alone (``from_flat(ExperimentSpec, model="tiny",
workload="chat", ttft_s=1, tpot_s=0.005, fabric="mesh16")``).

Errors in the inputs raise ``wse_emu.errors.UserError`` (the command line prints them as one
line and exits with 2), naming the argument, before any work: each function checks every
argument against its annotation on entry (``checks.typed``), then by range.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from wse_emu.compiler.cache import compile_cached
from wse_emu.compiler.options import compile_options
from wse_emu.hardware.fabric import ClusterSpec, FabricSpec
from wse_emu.hardware.fabric import load_fabric as fabric_file
from wse_emu.models.load import load_model as model_file
from wse_emu.models.spec import ModelSpec, stored_as
from wse_emu.pools import serve as serving
from wse_emu.pools.serve import Demand, ServeRun
from wse_emu.program.format import WaferProgram
from wse_emu.serving.tables import default_cache_dir
from wse_emu.serving.workload import WorkloadSpec
from wse_emu.sim.runner import HandoffRun, RegionRun
from wse_emu.util.checks import typed

if TYPE_CHECKING:  # at run time, imported on first use (``__getattr__``)
    from wse_emu.experiments.comparison import ExperimentReport, Space, VaryReport
    from wse_emu.experiments.drift import DriftReport, DriftSpec
    from wse_emu.experiments.frontier import FrontierReport
    from wse_emu.experiments.goodput import Targets
    from wse_emu.experiments.pairings import PairingsReport
    from wse_emu.experiments.spec import (
        Counting,
        Execution,
        ExperimentSpec,
        FrontierSpec,
        Hardware,
        Load,
        PairingsSpec,
        Speeds,
        WaferTiming,
        from_flat,  # noqa: F401 - the face's (see above)
    )
    from wse_emu.sim.functional.generate import Generation
    from wse_emu.sweeps.sweep import SweepRow, SweepSpec

__all__ = ["load_model", "load_fabric", "compile", "run", "handoff", "serve", "serve_pools",
           "experiment", "frontier", "pairings", "drift", "generate", "sweep", "draw",
           "check_serving", "default_cache_dir", "Space", "Targets", "ExperimentSpec",
           "FrontierSpec", "PairingsSpec", "DriftSpec", "Load", "Hardware", "Counting",
           "WaferTiming", "Execution", "Speeds"]

# The names imported above for type checkers alone (the experiments', the functional
# generator's, the sweeps'), imported when first asked for: compiling, running a step and
# serving do not need them, and importing them costs a tenth of a second of every command's
# start-up. ``checks.typed`` asks for those an annotation names. For the same reason the
# compiler's mapper, the step runner (with the engines under them) and the sweeps are imported
# by the functions that call them.
_LAZY_NAMES = {
    "wse_emu.experiments.comparison": ("ExperimentReport", "Space", "VaryReport"),
    "wse_emu.experiments.drift": ("DriftReport", "DriftSpec"),
    "wse_emu.experiments.frontier": ("FrontierReport",),
    "wse_emu.experiments.goodput": ("Targets",),
    "wse_emu.experiments.pairings": ("PairingsReport",),
    "wse_emu.experiments.spec": ("Counting", "Execution", "ExperimentSpec", "FrontierSpec",
                                 "Hardware", "Load", "PairingsSpec", "Speeds", "WaferTiming",
                                 "from_flat"),
    "wse_emu.sim.functional.generate": ("Generation",),
    "wse_emu.sweeps.sweep": ("SweepRow", "SweepSpec"),
}
_MODULE_OF = {name: module for module, names in _LAZY_NAMES.items() for name in names}


def __getattr__(name: str):
    """A name imported on first use (``_LAZY_NAMES``), and kept."""
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The module's names, those imported on first use among them before they are."""
    return sorted(set(globals()) | set(_MODULE_OF))


def _experiments():
    """The experiments' entry points (``experiments.run``), imported on first use."""
    return importlib.import_module("wse_emu.experiments.run")


@typed
def load_model(name_or_path: Path | str) -> ModelSpec:
    """A model preset's name (``programs/models/``), a model YAML, or a Hugging Face
    config.json (the file or its folder)."""
    return model_file(name_or_path)


@typed
def load_fabric(name_or_path: Path | str) -> FabricSpec:
    """A fabric preset's name (``programs/fabrics/``) or a fabric YAML."""
    return fabric_file(name_or_path)


def _model(model: ModelSpec | Path | str) -> ModelSpec:
    return model if isinstance(model, ModelSpec) else model_file(model)


@typed
def compile(model: ModelSpec | Path | str, fabric: FabricSpec | Path | str = "wse3",
            systems: int = 1, *, weight_format: str | None = None,
            expert_weight_format: str | None = None, **options) -> WaferProgram:
    """Compile ``model`` (a preset, a model YAML or a Hugging Face config.json) onto
    ``systems`` wafers of ``fabric``, its weight matrices (and separately its experts') stored
    as ``weight_format`` (``expert_weight_format``) when given; ``options`` are
    ``compiler.options.CompileOptions`` fields (plan="disaggregated", region=(w, h),
    layers_per_stage=...). Every argument is checked before the compiler starts."""
    settings = compile_options(**options)
    spec = stored_as(_model(model), weight_format, expert_weight_format)
    fabric = fabric if isinstance(fabric, FabricSpec) else fabric_file(fabric)
    # Read back when the same inputs were compiled by the same code before (``cache``).
    return compile_cached(spec, ClusterSpec(fabric, systems), settings, _compile_model)


def _compile_model(model: ModelSpec, cluster: ClusterSpec, settings) -> WaferProgram:
    """The compiler itself, imported when the cache does not hold the program."""
    from wse_emu.compiler.mapper import compile_model

    return compile_model(model, cluster, settings)


@typed
def run(program: WaferProgram, phase: str = "decode", *, region: str | None = None,
        engine: str = "fast", reuse: bool = True, progress: Callable | None = None,
        **shape) -> RegionRun:
    """Simulate one step of ``phase`` on a region of ``program`` (by default the first that
    serves the phase), of the ``shape`` given by name: decode ``batch`` sequences (1) at
    ``context`` (4096), with ``draft_tokens`` (0) the verify step of speculative decoding
    (each sequence's next token and that many drafted after it); or prefill ``tokens``
    (4096) in ``tiles`` tiles (4, as ``wse-emu run``). Stages alike are timed once unless
    ``reuse`` is off; ``progress(done, total)`` as stages finish. Its ``to_json()`` is what
    ``wse-emu run --json`` prints, the kernels' lower bounds included."""
    from wse_emu.compiler.bounds import stage_bounds
    from wse_emu.sim.steps import run_step

    result = run_step(program, phase, region, engine, reuse, progress, **shape)
    result.bounds = stage_bounds(program, result)
    return result


@typed
def handoff(program: WaferProgram, tokens: int = 4096, region: str | None = None) -> HandoffRun:
    """The KV cache of a ``tokens``-long prompt moved from a prefill region of a disaggregated
    ``program`` (``region``, by default the first) to its decode region, over the wafer's
    fabric or the off-wafer link: what ``wse-emu run --phase handoff --json`` prints."""
    from wse_emu.sim.steps import handoff as move_kv

    return move_kv(program, tokens, region)


@typed
def check_serving(workload: WorkloadSpec | Path | str | None = None, *,
                  trace: Path | str | None = None, rate: float | None = None,
                  requests: int | None = None, ttft_s: float | None = None,
                  tpot_s: float | None = None, cache_dir: Path | str | None = None,
                  **options) -> WorkloadSpec:
    """``serve``'s arguments, all but the program, checked before any work: the workload (the
    one it reads is returned), the targets, the cache's folder, and every serving option by
    name and range."""
    spec = serving.check_serving(Demand(workload, trace, rate, requests, ttft_s, tpot_s),
                                 **options)
    default_cache_dir(cache_dir)
    return spec


@typed
def serve(program: WaferProgram, workload: WorkloadSpec | Path | str | None = None, *,
          trace: Path | str | None = None, rate: float | None = None,
          requests: int | None = None, cache_dir: Path | str | None = None,
          ttft_s: float | None = None, tpot_s: float | None = None, loop: str = "compiled",
          **options) -> ServeRun:
    """Serve a workload (a preset, a YAML or a WorkloadSpec; or the replay of a ``trace``
    CSV) on ``program``, ``rate`` and ``requests`` overriding the workload's; ``options`` are
    ``ServeOptions`` fields (policy, prefill_tile, batch_limit, ...). Everything is checked
    before any work (``check_serving``). Returns the run: the per-request ``result``, the
    ``metrics`` (with the targets, the attainment) and the ``report`` ``wse-emu serve --json``
    prints."""
    return serving.serve_program(program, Demand(workload, trace, rate, requests, ttft_s,
                                                 tpot_s), cache_dir, loop, **options)


@typed
def serve_pools(model: ModelSpec | Path | str, workload: WorkloadSpec | Path | str | None = None,
                *, sides: str | dict, trace: Path | str | None = None,
                rate: float | None = None, requests: int | None = None,
                cache_dir: Path | str | None = None, ttft_s: float | None = None,
                tpot_s: float | None = None, loop: str = "compiled", **options) -> ServeRun:
    """``serve`` on pools named as on the command line: colocated on one (``sides`` a pool
    name: a wafer cluster, accelerator instances or GPUs, ``wse3x4``, ``trn2x2``,
    ``h200x8``), or disaggregated (``sides={"prefill": ..., "decode": ...}``), every copy of
    one side able to hand its KV to any copy of the other. Everything is checked before any
    work."""
    return serving.serve_named(model, Demand(workload, trace, rate, requests, ttft_s, tpot_s),
                               sides, cache_dir, loop, **options)


@typed
def experiment(spec: ExperimentSpec) -> ExperimentReport | VaryReport:
    """Colocated against disaggregated serving as ``spec`` describes (``ExperimentSpec``: the
    model, the load, the targets, the hardware, the search space, how the work runs): both
    plans tuned the same way, each plan's best confirmed on long runs, over the load's draws;
    or the same at each value of one input (``vary``). Every field was checked when the spec
    was made. The report's ``to_json()`` is what ``experiment disagg --json`` prints."""
    return _experiments().experiment(spec)


@typed
def frontier(spec: FrontierSpec) -> FrontierReport:
    """Each plan's frontier of output tokens/s per system against tokens/s per user, and the
    high-speed token capacity of both at the spec's user speed (by default the model's
    published vendor speed, ``programs/vendor_speeds.yaml``): the report ``experiment frontier
    --json`` prints."""
    return _experiments().frontier(spec)


@typed
def drift(spec: DriftSpec) -> DriftReport:
    """Both plans tuned on the spec's load, then served unchanged on each of its
    ``served_on`` workloads and tuned afresh there: per workload the ratio as tuned once and
    as retuned, each plan's regret, and the time a wafer split takes to be laid out anew. The
    report ``experiment drift --json`` prints."""
    return _experiments().drift(spec)


@typed
def pairings(spec: PairingsSpec) -> PairingsReport:
    """``frontier`` for every pairing of the spec's kinds of hardware: the report ``experiment
    pairings --json`` prints."""
    return _experiments().pairings(spec)


@typed
def generate(program: WaferProgram, prompt_ids: Sequence, new_tokens: int = 8, *,
             checkpoint: Path | str | None = None, weights_seed: int = 0) -> Generation:
    """Greedy generation computed through ``program``'s tiles, with a checkpoint's weights
    (a directory of config.json and *.safetensors) or random ones drawn from ``weights_seed``;
    returns the generator's result (``generated_ids``, the regions used)."""
    from wse_emu.sim.functional.generate import generate as generate_tokens

    return generate_tokens(program, prompt_ids, new_tokens, checkpoint, weights_seed)


@typed
def sweep(sweep: SweepSpec | Path | str, output: Path | str | None = None, *,
          scheduler: str | None = None, workers: int = 0, max_points: int | None = None,
          progress: Callable | None = None) -> tuple[Path, list[SweepRow]]:
    """Every point of a sweep (a SweepSpec or its YAML) not yet in ``output`` (by default a
    folder named after the sweep), on ``workers`` local processes as an experiment takes
    them, or on a dask cluster (``scheduler``); ``progress(done, total)`` after each point.
    Before the first point: every setting checked by name, the size against ``max_points``
    (by default ``MAX_POINTS``), and the folder created or refused. Returns the folder and
    every row, in the order of the sweep's points."""
    from wse_emu.sweeps.points import run_points
    from wse_emu.sweeps.sweep import SweepSpec, load_sweep

    spec = sweep if isinstance(sweep, SweepSpec) else load_sweep(sweep)
    return run_points(spec, output, scheduler, workers, max_points, progress)


@typed
def draw(run_dir: Path | str,
         what: Sequence | str = ("maps", "roofline", "serving", "experiment")) -> Path:
    """Draw a run directory's figures and report.html; returns the report's path. ``what``:
    kinds of figures, from maps, roofline, serving, experiment and sweep (a list, or words
    split by commas); a word that is none of them is refused by name."""
    from wse_emu.visualize.rundraw import draw_run

    return draw_run(Path(run_dir), what)
