"""Decode time against context and region size, as measured wafers behave: one layer of
Llama-3.1-8B on `wse2` takes longer with a longer context (more keys per PE), and on a larger
region longer too, but slowly: its weights are already spread thin, so only the communication
(hops across the wider strips, deeper trees) grows."""

import pytest

from wse_emu.cli.bench.kernels import one_layer
from wse_emu.hardware.fabric import load_fabric
from wse_emu.models.layer import MicroBatch
from wse_emu.sim.runner import run_region


def decode_cycles(program, context: int) -> int:
    step = MicroBatch("decode", batch=1, context=context)
    return run_region(program, program.regions[0].name, step).stages[0].cycles


@pytest.fixture(scope="module")
def wse2():
    return load_fabric("wse2")


@pytest.mark.slow
def test_decode_grows_with_the_context(wse2):
    program = one_layer(wse2, 420)
    short, long = decode_cycles(program, 1024), decode_cycles(program, 16384)
    assert long > short * 1.05


@pytest.mark.slow
def test_decode_grows_slowly_with_the_region(wse2):
    small = decode_cycles(one_layer(wse2, 420), 4096)
    large = decode_cycles(one_layer(wse2, 600), 4096)
    # Twice the PEs: more than before, but far from proportionally more.
    assert small < large < 1.5 * small
