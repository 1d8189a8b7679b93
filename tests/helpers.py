"""What the tests share: the fixtures' paths; experiment arguments with every knob fixed at
one value, each layout at its own pipeline depth and no confirming runs, so that a search of a
tiny model takes seconds (the tests that tune a knob override it); the rate searches of a list
of configurations, run to their answers; a made-up judged run; the command line run as a user
runs it, and its one-line errors; a generator checked against the reference forward pass; a
stage's simulated FLOPs against the op graph's; and small mixtures of experts."""

import json
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from wse_emu.compiler.mapper import compile_model
from wse_emu.compiler.options import CompileOptions
from wse_emu.experiments.goodput import Point, Pressure, Search, run_searches
from wse_emu.hardware.fabric import ClusterSpec, load_fabric
from wse_emu.kernels.stage import StageGraph
from wse_emu.models import layer as ly
from wse_emu.models.spec import ModelSpec
from wse_emu.serving.metrics import Percentiles, RunMetrics, UserSpeeds
from wse_emu.sim.functional.generate import prompt_tiles

FIXTURES = Path(__file__).parent / "fixtures"
HF_CONFIGS = FIXTURES / "hf_configs"  # one model per folder, as a downloaded snapshot has it
SMALL_CHAT = FIXTURES / "small_chat.yaml"  # 40 chat requests

QUICK_KNOBS = ["--token-budget", "64", "--copies", "1", "--prefill-tile", "64", "--interleave", "1",
               "--max-running", "0", "--batch-limit", "64", "--window-s", "0",
               "--layers-per-stage", "own"]


def search_all(configs, run_points, tolerance: float = 0.05) -> list:
    """Every configuration's rate search; ``run_points(jobs)`` evaluates (index, factor)
    pairs."""
    searches = [Search(c) for c in configs]
    run_searches(dict(enumerate(searches)), run_points, tolerance=tolerance)
    return searches


def made_up_point(rate: float, met: bool, ttft_p90_s: float = 0.5, tpot_p90_s: float = 0.5,
                  **numbers) -> Point:
    """A judged run at ``rate`` with the metrics and pressure given by name (the others 0,
    a steady window that kept its pace)."""
    def times(p90):
        return Percentiles(p90, p90, p90)
    pressure = {name: numbers.pop(name, 0.0) for name in Pressure.__dataclass_fields__}
    metrics = dict(requests=100, duration_s=10.0, ttft_s=times(ttft_p90_s),
                   tpot_s=times(tpot_p90_s), e2e_s=times(1.0), itl_s=times(tpot_p90_s),
                   output_tokens_per_s=0.0, requests_per_s=rate, slo_attainment=1.0,
                   goodput_requests_per_s=0.0, user_tokens_per_s=UserSpeeds(1.0, 1.0, 1.0),
                   refused=0, window_requests=80, window_s=8.0, window_output_tokens_per_s=0.0,
                   ttft_by_fifth_s=[0.0] * 5, ttft_growth_s=0.0, ttft_slope=0.0, pace=1.0,
                   too_short=False)
    return Point(rate, met, RunMetrics(**{**metrics, **numbers}), Pressure(**pressure))


# --- the command line, as a user runs it ---------------------------------------------------

def run_cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "wse_emu.cli.main", *map(str, args)],
                          capture_output=True, text=True, timeout=300, cwd=cwd)


def assert_one_line_error(proc, *needles):
    """Exit code 2, exactly one line on stderr starting 'wse-emu: error:', no traceback."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and proc.stderr.endswith("\n"), proc.stderr
    assert lines[0].startswith("wse-emu: error:"), proc.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


# --- numbers through the tiles, against the reference forward pass ------------------------

def relative(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


def follows_reference(generator, reference, prompt, tile: int, steps: int) -> None:
    """Float32 logits within 1e-4 relative of the reference at every prompt tile and decode
    step, and the same greedy tokens."""
    tiles = generator.run_prompt(prompt, all_logits=True)
    for (a, b), got in zip(prompt_tiles(len(prompt), tile), tiles):
        assert relative(got, reference.forward(prompt[a:b])) < 1e-4
    token = int(np.argmax(tiles[-1][-1]))
    for _ in range(steps):
        got, want = generator.step(token), reference.decode(token)
        assert relative(got, want) < 1e-4
        assert int(np.argmax(got)) == int(np.argmax(want))
        token = int(np.argmax(got))


# --- a stage's simulated work against the op graph's ---------------------------------------

def tasks_do_the_graphs_flops(program, stage, rows, step) -> StageGraph:
    """Per kernel of ``stage``, the FLOPs of the op graph's ``rows`` it runs (over the stage's
    layers and the step's tiles) are those its simulated tasks do; returns the built graph."""
    ops = ly.ops_by_name(program.model)
    names = {k.name for k in program.stage_kernels(stage)}
    want: dict[str, float] = {}
    for row in rows:
        if (row.layer is None and row.op in names) or (
                row.layer is not None and stage.layers[0] <= row.layer < stage.layers[1]):
            want[ops[row.op].kernel] = want.get(ops[row.op].kernel, 0) + row.cost.flops
    sg = StageGraph(program, stage, step)
    sg.build()
    got = {name: w.flops for name, w in sg.ledger.items()}
    for name in set(want) | set(got):
        assert got.get(name, 0) == pytest.approx(want.get(name, 0), rel=1e-9), name
    return sg


# --- small mixtures of experts -------------------------------------------------------------

BASE = dict(hidden_size=64, intermediate_size=96, num_layers=4, num_heads=4, num_kv_heads=2,
            head_dim=16, vocab_size=160)
# Small mixtures of experts, one per family, and the prompt they are computed on.
SPECS = {
    "mixtral": ModelSpec.from_fields("a-mixtral", "mixtral", **BASE, num_experts=8,
                                     experts_per_token=2,
                                     moe_intermediate_size=96),
    "qwen3_moe": ModelSpec.from_fields("a-qwen3-moe", "qwen3_moe", **BASE, qk_norm=True,
                                       num_experts=16,
                                       experts_per_token=4, moe_intermediate_size=32,
                                       norm_topk_prob=False),
    "gpt_oss": ModelSpec.from_fields("a-gpt-oss", "gpt_oss", **{**BASE, "sliding_window": 8},
                                     num_experts=8, experts_per_token=2, moe_intermediate_size=64,
                                     router_bias=True, expert_bias=True, attention_sinks=True,
                                     swiglu_limit=7.0, o_proj_bias=True, attention_bias=True,
                                     layer_types=("sliding_attention", "full_attention") * 2),
}


def compiled_on_mesh16(spec, plan="colocated", **options):
    """``spec`` compiled on one 16x16 mesh: colocated on the whole of it, or split."""
    region = (16, 16) if plan == "colocated" else None
    return compile_model(spec.validate("test"), ClusterSpec(load_fabric("mesh16"), 1),
                         CompileOptions(plan=plan, region=region, **options))


PROMPT = [5, 17, 3, 99, 42, 7, 11, 64, 23, 8, 150, 2, 77, 31, 19, 120, 9, 14]


# gpt-oss always has its YaRN rope (a config without one reads as transformers' default):
# here stretched from an original context shorter than the prompt.
# Qwen3-MoE with 18 outputs per expert: over 4 rows they round up to 5 a row, so gate's and
# up's runs hold two experts (36 outputs, 9 a row); over 7 rows, eight.
FAMILIES = {**{f: SPECS[f] for f in ("mixtral", "qwen3_moe")},
            "qwen3_moe_paired": SPECS["qwen3_moe"].replaced(name="a-qwen3-moe-paired",
                                                            moe_intermediate_size=18),
            "gpt_oss": SPECS["gpt_oss"].replaced(intermediate_size=64, rope_scaling="yarn",
                                                 rope_scaling_factor=4.0,
                                                 rope_original_max_positions=16,
                                                 max_position_embeddings=64, rope_theta=150000.0,
                                                 rope_truncate=False)}


def routed_experts(reference, layer, prompt) -> set[int]:
    """Experts the reference routes any token of ``prompt`` to in ``layer``."""
    seen: set[int] = set()
    original = reference._route

    def spy(index, x):
        chosen, w = original(index, x)
        if index == layer:
            seen.update(int(e) for e in np.unique(chosen))
        return chosen, w

    reference._route = spy
    reference.forward(prompt)
    return seen


# --- what an interrupted or killed command leaves behind ----------------------------------

def assert_whole(cache: Path, out: Path, killed: bool = False) -> None:
    """Every table the cache reads whole, and the run directory absent or complete (it takes
    its name only once written); unless the command was ``killed`` (SIGKILL: no handler runs,
    so a temporary file may stay, under a name nothing reads), no file half-written under a
    temporary name beside the cache either."""
    from wse_emu.program.format import WaferProgram
    from wse_emu.serving.tables import StageTable

    if not killed:
        partial = [*cache.parent.rglob("*.partial"), *cache.parent.glob(".*")]
        assert not partial, partial
    for entry in [*cache.glob("stage-table-*.npz"), *cache.glob("stage-times-*.npz")]:
        StageTable.from_npz(entry)  # raises if damaged or not matching its digest
    if out.exists():
        for path in out.glob("*.json"):
            json.loads(path.read_text())
        if (out / "program.json").exists():
            WaferProgram.load(out)


class ImageSources(HTMLParser):
    """The ``src`` of every image of an HTML page (``feed`` it the page)."""

    def __init__(self):
        super().__init__()
        self.sources = []

    def handle_starttag(self, tag, attrs):
        if tag == "img":
            self.sources.append(dict(attrs)["src"])


def forbid_work(monkeypatch, functions, message: str) -> None:
    """Every binding of ``functions`` in a loaded module of wse_emu replaced by one that fails
    the test with ``message``: the ways into work (compiling, timing, serving, starting
    workers) are found wherever they were imported, not listed module by module."""
    import sys

    def work(*args, **kwargs):
        raise AssertionError(message)
    _import_binders(functions)
    for module in [m for name, m in list(sys.modules.items())
                   if name.startswith("wse_emu") and m is not None]:
        for name, value in list(vars(module).items()):
            if any(value is f for f in functions):
                monkeypatch.setattr(module, name, work)


def _import_binders(functions) -> None:
    """Import every module of ours that binds one of ``functions`` when it is imported
    (``from ... import name`` at its top), so that its binding is there to be replaced and
    restored: the package imports some modules only when first needed (the compiler's mapper,
    the sweeps), and one first imported while the functions are replaced would keep the
    replacement after the test."""
    import ast
    import importlib

    import wse_emu
    import wse_emu.compiler

    names = frozenset(f.__name__ for f in functions)
    if names in _BINDERS_IMPORTED:
        return
    _BINDERS_IMPORTED.add(names)
    package = Path(wse_emu.__file__).parent
    roots = [(package, "wse_emu"), (Path(wse_emu.compiler.__file__).parent, "wse_emu.compiler")]
    for root, prefix in roots:
        for path in sorted(root.rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            if not any(isinstance(node, ast.ImportFrom) and not node.level
                       and any(a.name in names for a in node.names) for node in tree.body):
                continue
            parts = path.relative_to(root).with_suffix("").parts
            module = ".".join([prefix, *(parts[:-1] if parts[-1] == "__init__" else parts)])
            try:
                importlib.import_module(module)
            except ImportError:  # a module of an extra not installed here: nothing to bind
                pass


_BINDERS_IMPORTED: set = set()  # the sets of names whose binders were imported


def work_entries() -> list:
    """The functions every piece of work starts in: compiling a model (or reading it back),
    simulating a region's step, serving requests, building pools and their tables, starting
    workers, running or claiming a sweep."""
    from wse_emu.compiler.cache import compile_cached
    from wse_emu.compiler.mapper import compile_model
    from wse_emu.pools.kinds.wafer import wafer_pools, wafer_pools_of
    from wse_emu.pools.named import side_pools
    from wse_emu.serving.serve import serve
    from wse_emu.sim.runner import run_region
    from wse_emu.sweeps.sweep import claim_directory, run_sweep
    from wse_emu.util.workers import point_pool

    return [compile_model, compile_cached, run_region, serve, wafer_pools, wafer_pools_of,
            point_pool, side_pools, run_sweep, claim_directory]


class RecordingPool:
    """A pool that runs its jobs here, as a pool's workers would (``parallel`` or not), noting
    in ``seen`` when its jobs came, so that a test can check what the parent did first."""

    def __init__(self, seen: list, parallel: bool = True):
        self.seen, self.parallel = seen, parallel

    def bind(self, function, shared):
        def run(jobs, done=None):
            self.seen.append("jobs")
            out = [function(*shared, *job) for job in jobs]
            if done:
                done(len(jobs))
            return out
        return run
