"""Experts on the wafer, timed: tiny Mixtral-, Qwen3-MoE- and gpt-oss-shaped models compile with
every expert resident, colocated and disaggregated, and their steps run on both engines; the
tasks do the layer description's FLOPs, stay above the compiler's bounds, and a skewed routing
loads the popular experts' PEs so that the step slows down."""

from __future__ import annotations

import json

import pytest
from helpers import SPECS, compiled_on_mesh16, tasks_do_the_graphs_flops

from wse_emu.compiler.intensity import analyze
from wse_emu.compiler.opgraph import build_op_graph
from wse_emu.compiler.options import CompileOptions
from wse_emu.errors import UserError
from wse_emu.models.layer import MicroBatch
from wse_emu.sim.runner import run_region

STEPS = {"decode": MicroBatch("decode", batch=8, context=40),
         "prefill": MicroBatch("prefill", tokens=48, chunks=2)}




@pytest.mark.slow
@pytest.mark.parametrize("family", SPECS)
@pytest.mark.parametrize("plan", ["colocated", "disaggregated"])
def test_experts_compile_and_every_step_runs_above_its_bounds(family, plan):
    # The program's bounds are at its reference workloads: make them this test's steps.
    program = compiled_on_mesh16(SPECS[family], plan, bound_prefill_tokens=48, bound_decode_batch=8,
                       bound_decode_context=40)
    steps = {"decode": STEPS["decode"], "prefill": MicroBatch("prefill", tokens=48)}
    for region in program.regions:
        for phase, step in steps.items():
            run = run_region(program, region.name, step)
            assert run.step_cycles > 0
            for sr in run.stages:
                assert sr.cycles >= program.stages[sr.stage].bounds[phase]["cycles"]
        run_region(program, region.name, STEPS["prefill"])  # in token tiles too


@pytest.mark.parametrize("family", SPECS)
@pytest.mark.parametrize("phase", STEPS)
def test_expert_tasks_do_the_layer_descriptions_flops(family, phase):
    spec = SPECS[family].validate("test")
    step = STEPS[phase]
    program = compiled_on_mesh16(spec)
    rows = analyze(build_op_graph(spec), spec, step, program.fabric)["ops"]
    for stage in program.stages:
        tasks_do_the_graphs_flops(program, stage, rows, step)


def test_both_engines_time_the_expert_patterns_alike():
    program = compiled_on_mesh16(SPECS["mixtral"])
    step = STEPS["decode"]
    fast = run_region(program, "mixed0", step, engine="fast")
    cycle = run_region(program, "mixed0", step, engine="cycle")
    assert cycle.step_cycles == pytest.approx(fast.step_cycles, rel=0.25)


@pytest.mark.slow
def test_a_skewed_routing_loads_the_popular_experts_and_slows_the_step():
    spec = SPECS["mixtral"]  # 8 experts, each on its own run of columns
    step = MicroBatch("decode", batch=64, context=40)
    uniform = run_region(compiled_on_mesh16(spec), "mixed0", step)
    skewed = run_region(compiled_on_mesh16(spec, routing="skewed:2"), "mixed0", step)
    again = run_region(compiled_on_mesh16(spec, routing="skewed:2"), "mixed0", step)
    assert skewed.step_cycles == again.step_cycles  # seeded
    # The popular experts' PEs work longest: gate's busiest PE, and so the step.
    busiest = [max(s.kernel_busy["experts_gate"] for s in run.stages)
               for run in (uniform, skewed)]
    assert busiest[1] > 1.4 * busiest[0]
    assert skewed.step_cycles > 1.05 * uniform.step_cycles
    other = run_region(compiled_on_mesh16(spec, routing="skewed:2", routing_seed=1), "mixed0", step)
    assert other.step_cycles != skewed.step_cycles


def test_a_bad_routing_is_refused_by_name():
    with pytest.raises(UserError, match="routing"):
        CompileOptions(routing="zipf")


@pytest.mark.slow
def test_cli_runs_an_expert_model_under_a_stated_routing(tmp_path, capsys):
    import yaml

    from wse_emu.cli.main import main

    spec = SPECS["qwen3_moe"].replaced(num_experts=32).validate("test")
    path = tmp_path / "moe.yaml"
    path.write_text(yaml.safe_dump({**spec.to_dict(), "version": 1}))
    common = [str(path), "--fabric", "mesh16", "--region", "16x16", "--phase", "decode",
              "--batch", "32", "--context", "40", "--json"]
    steps = []
    for routing in ("uniform", "skewed:2"):
        assert main(["run", *common, "--routing", routing]) == 0
        steps.append(json.loads(capsys.readouterr().out)["step_cycles"])
    assert steps[1] > steps[0]
    # A compiled run directory is timed under the routing the flags state, and says so.
    out = tmp_path / "compiled"
    assert main(["compile", str(path), "--fabric", "mesh16", "--region", "16x16", "-o",
                 str(out)]) == 0
    capsys.readouterr()
    assert main(["run", str(out), *common[5:], "--routing", "skewed:2"]) == 0
    assert json.loads(capsys.readouterr().out)["step_cycles"] == steps[1]
    assert main(["run", str(out), *common[5:-1], "--routing", "skewed:2"]) == 0
    assert "skewed 2 routing, seed 0" in capsys.readouterr().out.splitlines()[0]
    for command in (["compile", "tiny"], ["experiment", "disagg", "tiny", "--fabric", "mesh16",
                                          "--workload", "chat", "--ttft-slo", "1",
                                          "--tpot-slo", "0.01"]):
        assert main([*command, "--routing", "skewed:1"]) == 2
        err = capsys.readouterr().err
        assert "apply to a mixture of experts" in err and err.count("\n") == 1
