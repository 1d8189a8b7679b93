"""The kernel benchmark: standalone GEMVs against their bounds and closed forms."""

import pytest

from wse_emu.cli.bench import kernels as bk


@pytest.mark.parametrize("side,k", [(64, 4096), (128, 4096)])
def test_gemv_is_above_its_bound_and_near_its_closed_form(side, k):
    fabric = bk.load_fabric("wse2")
    program, stage, kernel = bk.gemv_program(fabric, side, k)
    step = bk.MicroBatch("decode", batch=1, context=1)
    cycles = bk.graph_cycles(bk.kernel_graph(program, stage, "q_proj", step), fabric)
    bound = bk.kernel_bound(kernel, stage.rect, program.model, fabric, step)["cycles"]
    chunks = bk.gemv_chunks(program, stage, kernel, step)
    closed = bk.gemv_closed_form(fabric, side, k, kernel.trees["reduce"], chunks)
    assert cycles >= bound
    assert closed == pytest.approx(cycles, rel=0.15)

