"""Kernels and layers on square grids of their own, as published wafer measurements were
made: a GEMV [1, K] x [K, K] laid out as the compiler lays a matrix strip out (K along x, the
outputs across y, the root on the east edge), and one layer of Llama-3.1-8B compiled onto a
P x P region. ``wse-emu bench kernels`` and ``wse-emu validate`` time them."""

from __future__ import annotations

import dataclasses

import numpy as np

from wse_emu.compiler.mapper import compile_model
from wse_emu.compiler.options import CompileOptions
from wse_emu.hardware.fabric import ClusterSpec, FabricSpec
from wse_emu.kernels.primitives import CostModel
from wse_emu.models.load import load_model
from wse_emu.models.spec import ModelFields, ModelSpec
from wse_emu.program.format import Kernel, Rect, Region, Stage, WaferProgram
from wse_emu.program.trees import choose_levels
from wse_emu.sim.runner import execute, makespan_of


def graph_cycles(graph, fabric: FabricSpec) -> int:
    """The fast engine's makespan of a task graph, in cycles."""
    _, end, done, _ = execute(graph, fabric, "fast")
    return makespan_of(end, done)


def gemv_program(fabric: FabricSpec, side: int, k: int) -> tuple[WaferProgram, Stage, Kernel]:
    """A standalone K x K matrix kernel on a side x side grid, as the compiler would lay a
    strip of that shape out (K along x, outputs across y, root on the east edge)."""
    heads = k // 128
    model = ModelSpec.from_fields(ModelFields(f"gemv-{k}", "llama", k, k, 1, heads, heads, 128,
                                              256)).validate("bench")
    d = model.storage.dtype_bytes
    n_b = -(-k // side)
    cost = CostModel(fabric, d)
    levels = choose_levels(side, -(-n_b * d // 4), float(cost.add(np.array([n_b]), d)[0]),
                           fabric.hop_latency_cycles)
    rect = Rect(0, 0, 0, side, side)
    kernel = Kernel(id=0, stage=0, name="q_proj", kind="matrix",
                    pattern={"decode": "gemv_tree", "prefill": "gemm_stream"}, rect=rect,
                    layers=1, ops=["q_proj"], matrix=[k, k], grid=[side, side], k_axis="x",
                    weight_bytes=k * k * d, root="east", trees={"reduce": levels})
    stage = Stage(id=0, region="bench", index=0, rect=rect, layers=[0, 1], has_embedding=False,
                  has_head=False, strip_axis="x", kernel_ids=[0])
    program = WaferProgram(fabric=dataclasses.replace(fabric, width=side, height=side),
                           systems=1, model=model, options=CompileOptions(),
                           regions=[Region("bench", "decode", 0, [rect], [0])], stages=[stage],
                           kernels=[kernel], routes=[], arrays={})
    return program, stage, kernel


def one_layer(fabric: FabricSpec, side: int, plan: str = "colocated") -> WaferProgram:
    """One layer of Llama-3.1-8B (its vocabulary cut to 256) compiled onto a side x side
    region."""
    model = load_model("llama-3.1-8b").replaced(name="llama-3.1-8b-one-layer",
                                                num_layers=1, vocab_size=256)
    return compile_model(model, ClusterSpec(fabric, 1),
                         CompileOptions(region=(side, side), plan=plan))
