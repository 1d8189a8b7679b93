"""The accelerator roofline checked against AIConfigurator's measured database on a GPU both
describe: an H200 given as a roofline (the database's own peak FLOP/s, HBM bandwidth and
capacity, NVLink and network rates) times Llama-3.1-8B's steps at most as long as the
database's measurements, at every shape and tensor-parallel degree tried (a lower bound, as
the roofline claims to be), and at one GPU within a factor of two of them. Runs where the gpu
extra is installed."""

from importlib import resources
from pathlib import Path

import pytest
import yaml

from wse_emu.hardware.accelerator import AcceleratorSpec
from wse_emu.models import layer as ly
from wse_emu.models.load import load_model
from wse_emu.pools.kinds import gpu as gpu_pool
from wse_emu.pools.kinds.accelerator import step_seconds

pytest.importorskip("aiconfigurator_core")

SHAPES = [ly.MicroBatch("decode", batch=b, context=c)
          for b, c in ((1, 64), (1, 4096), (32, 4096), (64, 16384))] \
    + [ly.MicroBatch("prefill", tokens=t, prefix=p)
       for t, p in ((16, 0), (256, 0), (256, 4096), (4096, 0))]


def h200_roofline(tp: int) -> AcceleratorSpec:
    """An H200 node as a roofline, from the database's description of it."""
    path = Path(str(resources.files("aiconfigurator_core"))) / "systems" / "h200_sxm.yaml"
    data = yaml.safe_load(path.read_text())
    gpu, node = data["gpu"], data["node"]
    return AcceleratorSpec("h200-roofline", "H200", int(node["num_gpus_per_node"]), tp,
                           float(gpu["bfloat16_tc_flops"]), float(gpu["fp8_tc_flops"]),
                           float(gpu["mem_capacity"]), float(gpu["mem_bw"]),
                           float(node["intra_node_bw"]),
                           float(node["inter_node_bw"]) * int(node["num_gpus_per_node"]))


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_the_roofline_is_a_lower_bound_of_the_measured_steps(tp):
    from aiconfigurator_core.sdk import EngineHandle

    model = load_model("llama-3.1-8b")
    engine = EngineHandle.compile(gpu_pool.MODELS[model.name], "h200_sxm", gpu_pool.BACKEND,
                                  tp_size=tp, pp_size=1)
    spec = h200_roofline(tp)
    for step in SHAPES:
        roofline = step_seconds(spec, model, step)
        if step.phase == "decode":
            measured = engine.decode_step_latency(step.batch, step.context, 0) * 1e-3
        else:
            measured = engine.predict_prefill_latency(1, step.prefix + step.tokens,
                                                      step.prefix) * 1e-3
        assert roofline <= measured, (step, roofline, measured)
        if tp == 1:
            assert measured < 2 * roofline, (step, roofline, measured)
