"""The fabric's router fields (virtual channels, queue depth) reach the engines wherever a
program runs, take the engines' former constants by default, and old programs still load."""

import dataclasses
import json

import numpy as np
import pytest

from wse_emu.compiler.mapper import compile_model
from wse_emu.compiler.options import CompileOptions
from wse_emu.engines import cycle, fast
from wse_emu.errors import UserError
from wse_emu.hardware.fabric import ClusterSpec, load_fabric, with_overrides
from wse_emu.kernels.stage import stage_graph
from wse_emu.models.layer import MicroBatch
from wse_emu.models.load import load_model
from wse_emu.program.format import WaferProgram, _digest_of
from wse_emu.sim import runner

DECODE = MicroBatch("decode", batch=2, context=64)


@pytest.fixture(scope="module")
def tiny_16():
    return compile_model(load_model("tiny"), ClusterSpec(load_fabric("mesh16"), 1),
                         CompileOptions())


def on_routers(program, **fields):
    return dataclasses.replace(program, fabric=with_overrides(program.fabric, **fields))


def stage_cycles(program, engine="cycle", step=DECODE):
    return runner.run_region(program, "mixed0", step, engine).stages[0].cycles


def test_the_defaults_are_the_constants_the_engines_ran_with(tiny_16):
    """A stage on the defaults times exactly as the engines called with 4 virtual channels of
    8 wavelets (what the runner passed before they were fields)."""
    stage = tiny_16.stages[tiny_16.regions[0].stage_ids[0]]
    graph, _, _ = stage_graph(tiny_16, stage, DECODE)
    c = cycle.run_graph(graph, 4, 8, 1, 2, runner.CYCLE_ENGINE_MAX_CYCLES)
    f = fast.run(graph, 1, 2, 8)
    assert stage_cycles(tiny_16) == runner.makespan_of(c.task_end, c.t_done)
    assert stage_cycles(tiny_16, "fast") == runner.makespan_of(f.task_end, f.msg_done)


def test_the_cycle_engine_runs_a_stage_on_the_fabric_routers(tiny_16):
    default = stage_cycles(tiny_16)
    shallow = stage_cycles(on_routers(tiny_16, queue_wavelets=1))
    narrow = stage_cycles(on_routers(tiny_16, virtual_channels=1, queue_wavelets=1))
    assert shallow > default
    assert narrow >= shallow
    # More channels than the kernels' four message classes, or deeper queues than the stage
    # ever fills, change nothing.
    assert stage_cycles(on_routers(tiny_16, virtual_channels=8, queue_wavelets=64)) == default


def test_the_fast_engine_gets_the_fabric_queue_depth(tiny_16, monkeypatch):
    seen = []
    real = fast.run

    def spy(graph, hop, ramp, queue_wavelets):
        seen.append(queue_wavelets)
        return real(graph, hop, ramp, queue_wavelets)

    monkeypatch.setattr(fast, "run", spy)
    stage_cycles(on_routers(tiny_16, queue_wavelets=3), "fast")
    assert seen and set(seen) == {3}
    split = compile_model(load_model("tiny"), ClusterSpec(load_fabric("mesh16"), 1),
                          CompileOptions(plan="disaggregated"))
    seen.clear()
    runner.kv_handoff(on_routers(split, queue_wavelets=5), "prefill0", "decode0", 16)
    assert seen == [5]


def test_the_cycle_engine_refuses_router_queues_beyond_its_memory(tiny_16, monkeypatch):
    monkeypatch.setattr(cycle, "MAX_QUEUE_BYTES", 1000)
    with pytest.raises(UserError, match="`virtual_channels` of 8 `queue_wavelets`"):
        stage_cycles(tiny_16)


def test_a_program_saved_before_the_router_fields_loads_and_runs_alike(tiny_16, tmp_path):
    tiny_16.save(tmp_path)
    path = tmp_path / "program.json"
    data = json.loads(path.read_text())
    for field in ("virtual_channels", "queue_wavelets"):
        del data["fabric"][field]
    with np.load(tmp_path / "program.npz") as npz:
        arrays = {k: npz[k] for k in npz.files if k != "format_version"}
    data["digest"] = _digest_of(data, arrays)  # as the program was written then
    path.write_text(json.dumps(data))
    old = WaferProgram.load(tmp_path)
    assert (old.fabric.virtual_channels, old.fabric.queue_wavelets) == (4, 8)
    assert old.fabric == tiny_16.fabric
    assert stage_cycles(old) == stage_cycles(tiny_16)
