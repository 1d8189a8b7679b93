"""GPUs as pools: GPUs timed from AIConfigurator's measured data (the ``gpu``
extra; refused by name without it), named by our names for them (``h200``) with the
GPUs per copy when fixed (``h200x8tp2``), else tried at every tensor parallel degree that holds
the model. A system is one node of them (part of a node counts whole); a unit draws the
database's GPU power.

GPU pools from measured data: AIConfigurator's performance databases (``aiconfigurator-core``
on PyPI, Apache-2.0; per-op timings collected on real GPUs with TensorRT-LLM), an optional
extra (``pip install -e '.[gpu]'``). Without it a GPU pool is refused by name.

A pool of N GPUs holds N / tp copies of the model: tp as named (``h200x8tp2``), or by default
the fewest GPUs (a power of two within a node) whose memory the weights take at most half of,
so that as much again is left for the KV cache. A copy's prefill tile and decode step take the
times the database predicts for them; its KV capacity is the database's own estimate; a KV
handoff leaves a node over its GPUs' network links and arrives after their point-to-point
latency (the database's system description, as are the node's size and the GPUs' power).
Every result names the database it came from (``GpuSpec.source``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from importlib import metadata, resources
from pathlib import Path

import yaml

from wse_emu.errors import UserError
from wse_emu.models.spec import ModelSpec
from wse_emu.pools.kinds.base import ServerKind, Side
from wse_emu.serving.pools import PHASES, StagePool
from wse_emu.serving.tables import SERVER_AXES, StageTable, timed_table

# Our names of the GPUs, and the database's.
GPUS = {"a100": "a100_sxm", "h100": "h100_sxm", "h200": "h200_sxm", "b200": "b200_sxm",
        "gb200": "gb200"}
# Our model presets the database describes, by its names for them.
MODELS = {"llama-3.1-8b": "meta-llama/Meta-Llama-3.1-8B",
          "llama-3.1-70b": "meta-llama/Meta-Llama-3.1-70B",
          "gpt-oss-120b": "openai/gpt-oss-120b", "gpt-oss-20b": "openai/gpt-oss-20b"}
BACKEND, BACKEND_VERSION = "trtllm", "current"
MEMORY_SHARE = 0.9  # of the memory left free after the weights, for the KV cache (TRT-LLM's)


def gpu_available() -> bool:
    try:
        import aiconfigurator_core  # noqa: F401
    except ImportError:
        return False
    return True


def _require():
    if not gpu_available():
        raise UserError("GPU pools need AIConfigurator's databases: pip install -e '.[gpu]'")


@dataclass(frozen=True)
class GpuSpec:
    """A GPU as the database describes it: its node and power."""

    name: str  # ours: h200
    system: str  # the database's: h200_sxm
    gpus_per_node: int
    network_bytes_per_s: float  # per GPU, out of its node, each way
    intra_node_bytes_per_s: float  # per GPU, inside its node, each way
    network_latency_s: float  # point to point, one way (the database's own correction)
    memory_bytes: float  # per GPU
    power_w: float  # per GPU

    @property
    def source(self) -> str:
        return (f"AIConfigurator database (aiconfigurator-core "
                f"{metadata.version('aiconfigurator-core')}), {self.system}, {BACKEND} "
                f"({BACKEND_VERSION})")


def load_gpu(name: str) -> GpuSpec:
    """The GPU ``name`` (one of ``GPUS``) from the database's system description."""
    _require()
    if name not in GPUS:
        raise UserError(f"unknown GPU '{name}': choose one of {', '.join(GPUS)}")
    path = Path(str(resources.files("aiconfigurator_core"))) / "systems" / f"{GPUS[name]}.yaml"
    data = yaml.safe_load(path.read_text())
    node, gpu = data["node"], data["gpu"]
    return GpuSpec(name, GPUS[name], int(node["num_gpus_per_node"]),
                   float(node["inter_node_bw"]), float(node["intra_node_bw"]),
                   float(node.get("p2p_latency", 0.0)), float(gpu["mem_capacity"]),
                   float(gpu.get("power", 0.0)))


def _model_name(model: ModelSpec) -> str:
    if model.name not in MODELS:
        raise UserError(f"GPU pools know the models of AIConfigurator's database: "
                        f"{', '.join(MODELS)}; got {model.name}")
    return MODELS[model.name]


def _kv_tokens(gpu: GpuSpec, model: ModelSpec, tp: int) -> int:
    """The database's own estimate of the KV tokens one copy on ``tp`` GPUs holds."""
    from aiconfigurator_core import sdk

    try:
        estimate = sdk.estimate_kv_cache(
            _model_name(model), gpu.system, BACKEND, BACKEND_VERSION, max_num_tokens=8192,
            max_batch_size=256, memory_fraction_kind="of_free",
            memory_fraction_value=MEMORY_SHARE, tp_size=tp)
    except ValueError as exc:
        raise UserError(f"AIConfigurator's database gives no KV estimate for {model.name} on "
                        f"{tp} x {gpu.name}: {str(exc).splitlines()[0]}") from None
    tokens = int(estimate["total_kv_size_tokens"])
    if tokens < 1:
        raise UserError(f"{model.name} leaves no room for KV on {tp} x {gpu.name}")
    return tokens


def tensor_parallel(gpu: GpuSpec, model: ModelSpec, gpus: int, asked: int | None = None) -> int:
    """GPUs per copy: ``asked`` (a power of two dividing ``gpus``, within a node), or the
    fewest whose memory the weights take at most half of."""
    if asked is not None:
        if asked < 1 or asked & (asked - 1) or gpus % asked or asked > gpu.gpus_per_node:
            raise UserError(f"tp{asked} on {gpus} x {gpu.name}: tp must be a power of two "
                            f"dividing the GPUs, at most a node's {gpu.gpus_per_node}")
        return asked
    tp = 1
    while tp <= min(gpus, gpu.gpus_per_node):
        if gpus % tp == 0 and model.weight_bytes() <= 0.5 * tp * gpu.memory_bytes:
            return tp
        tp *= 2
    raise UserError(f"{model.name} does not fit {gpus} x {gpu.name} with room for its KV "
                    f"cache (its weights {model.weight_bytes() / 1e9:.0f} GB; a node holds "
                    f"{gpu.gpus_per_node})")


def step_table(engine, phase: str, clock_hz: float, axes: tuple,
               riding: bool = False) -> StageTable:
    """The database's step times over the shapes ``axes`` for ``phase``, in serving cycles;
    ``riding``: a decode micro-batch's attention alone, what it adds to a step it shares
    with a prompt's chunk (the database's own split of a mixed step: the chunk's and the
    sequences' tokens through the other ops together, each one's attention apart)."""
    def seconds(a: int, b: int) -> float:
        # The database's prompt length counts the cached prefix; its times are in ms.
        if riding:
            ms = engine.mixed_step_breakdown(0, a, b, 2, 0)[3]
        elif phase == "decode":
            ms = engine.decode_step_latency(a, b, 0)
        else:
            ms = engine.predict_prefill_latency(1, b + a, b)
        return ms * 1e-3
    return timed_table(phase, axes, clock_hz, seconds)


def gpu_pools(gpu: GpuSpec, model: ModelSpec, role: str, clock_hz: float, gpus: int,
              first_system: int = 0, axes: dict = SERVER_AXES,
              tp: int | None = None) -> list[StagePool]:
    """The copies of ``model`` on ``gpus`` GPUs, ``tp`` each (``tensor_parallel``), in
    ``role``, timed over ``axes`` (phase -> its table's axes); node k is system
    ``first_system + k``."""
    _require()
    from aiconfigurator_core.sdk import EngineHandle

    if role not in PHASES:
        raise UserError(f"`role` must be one of {', '.join(PHASES)}, got {role!r}")
    _model_name(model)  # a model the database does not describe: refused first
    tp = tensor_parallel(gpu, model, gpus, tp)
    # The database logs, on stderr, defaults it lacks for other frameworks than ours.
    logging.getLogger("aiconfigurator_core").setLevel(logging.ERROR)
    engine = EngineHandle.compile(_model_name(model), gpu.system, BACKEND, tp_size=tp,
                                  pp_size=1)
    tables = {phase: step_table(engine, phase, clock_hz, axes[phase]) for phase in PHASES[role]}
    # A copy runs a chunk and the decode micro-batch beside it as one step.
    riding = step_table(engine, "decode", clock_hz, axes["decode"], riding=True) \
        if role == "mixed" else None
    capacity = _kv_tokens(gpu, model, tp)
    return [StagePool(f"{gpu.name}-tp{tp}.{copy}", role, capacity, tables.get("prefill"),
                      tables.get("decode"), first_system + copy * tp // gpu.gpus_per_node,
                      gpu.intra_node_bytes_per_s * tp / clock_hz,
                      gpu.network_bytes_per_s * tp / clock_hz, riding,
                      gpu.network_latency_s * clock_hz)
            for copy in range(gpus // tp)]


class GpuKind(ServerKind):
    order = 2  # where its names are tried: third
    noun = "a GPU"
    takes_tp = True

    def presets(self) -> list[str]:
        return list(GPUS)

    def load(self, name: str) -> GpuSpec:
        return load_gpu(name)  # refused by name without the extra

    def owns(self, hardware) -> bool:
        return isinstance(hardware, GpuSpec)

    def per_system(self, hardware: GpuSpec) -> int:
        return hardware.gpus_per_node

    def power_w(self, hardware: GpuSpec) -> float:
        return hardware.power_w

    def variants(self, name, model, copies: tuple, depths: tuple) -> list[Side]:
        """At the degree named, or each power of two from the fewest GPUs that hold the
        model to a node or the pool's GPUs (the splits AIConfigurator tries)."""
        gpu = name.hardware
        if name.tensor_parallel is not None:
            return [Side(name, tensor_parallel(gpu, model, name.count, name.tensor_parallel))]
        tp, out = tensor_parallel(gpu, model, name.count), []
        while tp <= min(name.count, gpu.gpus_per_node):
            if name.count % tp == 0:
                out.append(Side(name, tp))
            tp *= 2
        return out

    def label(self, side: Side) -> str:
        return f"{side.pool.count} x {side.pool.hardware.name} tp{side.tp}"

    def pools(self, model, side: Side, role: str, first: int, clock_hz: float,
              cache: Path, grid: str, reach: int = 0) -> list:
        name = side.pool
        axes = {phase: self.table_axes(grid, phase) for phase in ("prefill", "decode")}
        return [replace(pool, engine=self.engine_knobs())
                for pool in gpu_pools(name.hardware, model, role, clock_hz, name.count, first,
                                      axes, side.tp or name.tensor_parallel)]

    def step_times_source(self, hardware: GpuSpec) -> str:
        return hardware.source


GPU = GpuKind()
KIND = GPU  # found by ``kinds.kinds()``
