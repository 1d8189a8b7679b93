"""Stage tables that reach a workload's contexts: past the grids' longest rung, the contexts
it reaches are timed by the engine (``tables.reaching``), never extrapolated, and serving reads
them there."""

import numpy as np
import pytest
import yaml

from wse_emu import api
from wse_emu.pools.kinds.wafer import wafer_pools
from wse_emu.serving.tables import (
    DECODE_CONTEXT,
    LONG_CONTEXTS,
    build_table,
    grid_axes,
    longest_context,
    reaching,
)
from wse_emu.serving.workload import Requests


@pytest.mark.parametrize("reach, added", [
    (0, ()), (16384, ()), (16385, (32768,)), (32768, (32768,)),
    (100_000, (32768, 65536, 131072)), (200_000, (32768, 65536, 131072, 200_000)),
])
def test_the_axis_gains_the_rungs_up_to_the_reach(reach, added):
    assert reaching(DECODE_CONTEXT, reach) == DECODE_CONTEXT + added
    assert reaching(DECODE_CONTEXT, reach)[-1] >= reach


def test_both_grids_and_both_phases_reach_alike():
    for grid in ("full", "quick"):
        for phase in ("decode", "prefill", "verify4"):
            sizes, contexts = grid_axes(grid, phase, 40_000)
            assert sizes == grid_axes(grid, phase)[0]
            assert contexts[-2:] == (32768, 65536) and set(LONG_CONTEXTS) & set(contexts)


def test_the_longest_context_is_a_prompt_and_its_output():
    one = Requests(np.zeros(2), np.array([10, 30_000]), np.array([5, 7]), np.arange(2),
                   np.zeros(2, int), np.zeros(2))
    assert longest_context(one) == 30_007 and longest_context() == 0


@pytest.fixture(scope="module")
def long_tiny(tmp_path_factory):
    """tiny with positions for 65,536 tokens, on a mesh whose KV holds such contexts."""
    data = yaml.safe_load(preset("tiny").read_text())
    data.update(name="tiny-long", max_position_embeddings=65536)
    path = tmp_path_factory.mktemp("long-tiny") / "tiny-long.yaml"
    path.write_text(yaml.safe_dump(data))
    return api.compile(str(path), "mesh64", region=(64, 64))


def preset(name):
    from wse_emu.util.configfile import preset_dir

    return preset_dir("models") / f"{name}.yaml"


def test_a_context_past_the_grid_is_timed_not_extrapolated(long_tiny, tmp_path):
    """The pools' tables hold the rung past the grid, and read there they give the engine's
    time for that shape, which a line through the grid's last two rungs would not."""
    region = long_tiny.regions[0].name
    pools = wafer_pools(long_tiny, tmp_path, grid="quick", reach=40_000)
    decode = pools[0].decode
    assert 65536 in decode.axis1 and 32768 in decode.axis1
    timed = build_table(long_tiny, region, "decode", axes=((4,), (65536,)),
                        cache_dir=tmp_path)
    assert decode.vector(4, 65536)[-1] == pytest.approx(timed.vector(4, 65536)[-1])
    short = wafer_pools(long_tiny, tmp_path, grid="quick")[0].decode
    assert 65536 not in short.axis1


def test_serving_a_long_workload_times_its_contexts(long_tiny, tmp_path):
    workload = tmp_path / "long.yaml"
    workload.write_text(yaml.safe_dump({
        "version": 1, "name": "long", "arrival": "poisson", "rate": 5, "requests": 3,
        "prompt": {"kind": "fixed", "value": 20_000}, "output": {"kind": "fixed", "value": 4}}))
    cache = tmp_path / "tables"
    run = api.serve(long_tiny, workload, cache_dir=cache)
    assert run.metrics.requests == 3
    axes = [np.load(path)["axis1"] for path in cache.glob("stage-table-*.npz")]
    assert any(32768 in a for a in axes)
