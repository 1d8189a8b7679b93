"""Accelerators as pools: an instance (a preset such as ``trn2``, or an accelerator YAML)
timed by its stated roofline (below), laid out as its file says. A
system is one instance, drawing the instance power its file cites.

Accelerator pools: copies of a model on accelerator instances, timed by their roofline.

A copy spans ``tensor_parallel`` chips of one instance (``AcceleratorSpec``). A step of a
micro-batch runs every op of the model's op graph (``wse_emu.models.layer``: the same FLOPs and
bytes the wafer's kernels are held to) at the slower of its compute and its memory time on
the copy's chips, attention as one fused kernel (scores, softmax and weighted sum: the scores
stay on chip, as fused attention kernels keep them, so only the queries, the KV cache read
and the output move), plus two ring all-reduces of the hidden state per layer (after attention
and after the MLP, as tensor parallelism splits them) and a fixed overhead per step. A chunk
of a prompt and a decode micro-batch served together (chunked serving) are one step: the
chunk's time at their tokens together, plus the decode's attention (``pools.Pool.riding``). The copy
is one pipeline stage; its KV capacity is the HBM left after the weights and the runtime's
share. The step times fill ``StageTable``s over the same micro-batch grid as a wafer's, in
cycles of the serving clock, so serving treats the copy as it treats a wafer region
(``pools.StagePool``).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from wse_emu.errors import UserError
from wse_emu.hardware.accelerator import AcceleratorSpec, load_accelerator
from wse_emu.models import layer as ly
from wse_emu.models.spec import ModelSpec
from wse_emu.pools.kinds.base import ServerKind, Side
from wse_emu.serving.pools import PHASES, StagePool
from wse_emu.serving.tables import SERVER_AXES, StageTable, timed_table
from wse_emu.util.configfile import preset_names

# The ops a fused attention kernel runs as one, in the order the op graph lists them; the
# ops that multiply by weight matrices.
FUSED_ATTENTION = (ly.ATTN_SCORES, ly.SOFTMAX, ly.ATTN_WEIGHTED_SUM)
MATRIX_KINDS = (ly.GEMM, ly.EXPERT_GEMM)


def step_seconds(spec: AcceleratorSpec, model: ModelSpec, step: ly.MicroBatch,
                 riding: bool = False) -> float:
    """One micro-batch through the whole model on one copy: every op at the slower of its
    compute and memory time, the layers' all-reduces and the step's overhead. ``riding``: only
    what a decode micro-batch adds to a step it shares with a prompt's chunk, its attention
    (the rest is the chunk's, read at their tokens together: ``pools.Pool.riding``)."""
    tp = spec.tensor_parallel
    # Weight matrices multiply at the peak of their stored format; everything else (attention
    # among it) in 16 bits.
    matrix_flops_per_s = tp * spec.flops_per_s(model.storage.matrix_bytes_per_weight()) \
        * spec.matrix_efficiency
    other_flops_per_s = tp * spec.bf16_flops_per_s * spec.matrix_efficiency
    bytes_per_s = tp * spec.memory_bytes_per_s * spec.memory_efficiency

    def seconds_of(cost: ly.OpCost, kind: str = "") -> float:
        rate = matrix_flops_per_s if kind in MATRIX_KINDS else other_flops_per_s
        return max(cost.flops / rate, cost.bytes / bytes_per_s)

    def roofline(ops, layer=None) -> float:
        costs = [(op.kind, ly.op_cost(op, model, step, layer)) for op in ops]
        fused = [c for kind, c in costs if kind in FUSED_ATTENTION]
        alone = 0.0 if riding else sum(seconds_of(c, kind) for kind, c in costs
                                       if kind not in FUSED_ATTENTION)
        if not fused:
            return alone
        scores, *_, weighted = fused
        moved = ly.OpCost(sum(c.flops for c in fused), sum(c.weight_bytes for c in fused),
                          scores.act_in_bytes, weighted.act_out_bytes,
                          kv_read_bytes=scores.kv_read_bytes + weighted.kv_read_bytes)
        return alone + seconds_of(moved)

    ops = ly.layer_ops(model)
    # Layers differ only in their attention window: time one layer of each window.
    by_window: dict = {}
    for layer in range(model.num_layers):
        by_window.setdefault(model.attention.window(layer), []).append(layer)
    seconds = sum(len(layers) * roofline(ops, layers[0]) for layers in by_window.values())
    if riding:
        return seconds
    seconds += roofline(ly.input_ops(model)) + roofline(ly.output_ops(model))
    if tp > 1:
        hidden = step.new_tokens * model.hidden_size * model.storage.dtype_bytes
        ring = 2 * (tp - 1) / tp * hidden / spec.interconnect_bytes_per_s
        seconds += 2 * model.num_layers * ring
    return seconds + spec.step_overhead_s


def step_table(spec: AcceleratorSpec, model: ModelSpec, phase: str, clock_hz: float,
               axes: tuple, riding: bool = False) -> StageTable:
    """``step_seconds`` over the micro-batch shapes ``axes`` for ``phase``, in serving
    cycles."""
    def seconds(a: int, b: int) -> float:
        step = (ly.MicroBatch("decode", batch=a, context=b) if phase == "decode"
                else ly.MicroBatch("prefill", tokens=a, prefix=b))
        return step_seconds(spec, model, step, riding)
    return timed_table(phase, axes, clock_hz, seconds)


def kv_capacity_tokens(spec: AcceleratorSpec, model: ModelSpec) -> int:
    """Tokens of KV cache one copy holds: its chips' HBM less the runtime's share and the
    weights. A model whose weights do not fit is refused, by how much."""
    usable = spec.tensor_parallel * spec.memory_bytes * (1 - spec.reserved_memory_share)
    left = usable - model.weight_bytes()
    if left < model.kv_bytes_per_token():
        raise UserError(
            f"{model.name} does not fit {spec.tensor_parallel} x {spec.device} ({spec.name}): "
            f"its weights are {model.weight_bytes() / 1e9:.1f} GB of "
            f"{usable / 1e9:.1f} GB usable, leaving no room for its KV cache")
    return int(left // model.kv_bytes_per_token())


def accelerator_pools(spec: AcceleratorSpec, model: ModelSpec, role: str, clock_hz: float,
                      instances: int = 1, first_system: int = 0,
                      axes: dict = SERVER_AXES) -> list[StagePool]:
    """Every copy of ``model`` on ``instances`` instances of ``spec``, in ``role`` (mixed,
    prefill or decode), timed for a serving clock of ``clock_hz`` over ``axes`` (phase -> its
    table's axes); instance k is system ``first_system + k`` of the cluster."""
    if role not in PHASES:
        raise UserError(f"`role` must be one of {', '.join(PHASES)}, got {role!r}")
    if instances < 1:
        raise UserError(f"`instances` must be at least 1, got {instances}")
    tables = {phase: step_table(spec, model, phase, clock_hz, axes[phase])
              for phase in PHASES[role]}
    # A copy runs a chunk and the decode micro-batch beside it as one step.
    riding = step_table(spec, model, "decode", clock_hz, axes["decode"], riding=True) \
        if role == "mixed" else None
    capacity = kv_capacity_tokens(spec, model)
    return [StagePool(f"{spec.name}-{k}.{copy}", role, capacity, tables.get("prefill"),
                      tables.get("decode"), first_system + k,
                      spec.interconnect_bytes_per_s / clock_hz,
                      spec.network_bytes_per_s / clock_hz, riding,
                      spec.network_latency_s * clock_hz)
            for k in range(instances) for copy in range(spec.copies)]


class AcceleratorKind(ServerKind):
    order = 1  # where its names are tried: second
    noun = "an accelerator"
    file_mark = "its `device`"

    def presets(self) -> list[str]:
        return preset_names("accelerators")

    def load(self, name: str) -> AcceleratorSpec:
        return load_accelerator(name)

    def describes(self, mapping: dict) -> bool:
        return "device" in mapping  # an accelerator names its chip

    def load_file(self, path: Path) -> AcceleratorSpec:
        return load_accelerator(path)

    def owns(self, hardware) -> bool:
        return isinstance(hardware, AcceleratorSpec)

    def power_w(self, hardware: AcceleratorSpec) -> float:
        return hardware.instance_power_w

    def label(self, side: Side) -> str:
        count, hw = side.pool.count, side.pool.hardware
        return hw.name if count == 1 else f"{count} x {hw.name}"

    def pools(self, model, side: Side, role: str, first: int, clock_hz: float,
              cache: Path, grid: str, reach: int = 0) -> list:
        name = side.pool
        axes = {phase: self.table_axes(grid, phase) for phase in ("prefill", "decode")}
        return [replace(pool, engine=self.engine_knobs())
                for pool in accelerator_pools(name.hardware, model, role, clock_hz, name.count,
                                              first, axes)]

    def step_times_source(self, hardware: AcceleratorSpec) -> str:
        return f"the roofline of {hardware.name} (lower bounds)"


ACCELERATOR = AcceleratorKind()
KIND = ACCELERATOR  # found by ``kinds.kinds()``
