"""The Python API: the README's example runs, and each function returns what its command
prints."""

import json
import re
from pathlib import Path

import pytest
from helpers import SMALL_CHAT

import wse_emu
from wse_emu import api
from wse_emu.cli.main import main
from wse_emu.errors import UserError
from wse_emu.experiments.comparison import ExperimentReport, Space
from wse_emu.util.fmt import seconds

README = Path(__file__).resolve().parents[2] / "README.md"


@pytest.mark.e2e
def test_the_readme_example_runs(capsys):
    block = re.search(r"### Python\n.*?```python\n(.*?)```", README.read_text(), re.S).group(1)
    exec(compile(block, "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert re.fullmatch(r"\d+ us per token on region mixed0\n", out)


def test_the_functions_are_reachable_from_the_package():
    assert wse_emu.compile is api.compile and wse_emu.serve is api.serve
    with pytest.raises(AttributeError):
        wse_emu.no_such_function  # noqa: B018


def _printed_json(capsys, *argv) -> dict:
    assert main(["--quiet", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.e2e
def test_a_step_is_what_run_prints_and_shows_itself_in_a_line(capsys):
    program = api.compile("tiny", "mesh16", region=(8, 8))
    step = api.run(program, "decode", batch=2, context=64)
    printed = _printed_json(capsys, "run", "tiny", "--fabric", "mesh16", "--region", "8x8",
                            "--batch", "2", "--context", "64")
    data = step.to_json()
    assert data.pop("wall_seconds") > 0 and printed.pop("wall_seconds") > 0
    assert data == printed and all(s["kernel_bound_cycles_each"] for s in data["stages"])
    # A notebook shows the step in one short line (never its per-PE arrays), numbers as the
    # command line writes them.
    shown = repr(step)
    assert shown.startswith("RegionRun(region='mixed0', decode of batch 2 at context 64, "
                            f"{len(step.stages)} stages, {seconds(step.step_seconds)}/step, ")
    assert "\n" not in shown and len(shown) < 250 and "array" not in shown
    assert not re.search(r"\de[+-]\d", shown)
    stage = repr(step.stages[0])
    assert stage.startswith(f"StageRun(stage=0, {step.stages[0].cycles:,} cycles, ")
    assert "\n" not in stage and len(stage) < 120
    assert step.stages[1].to_json().items() <= {**data["stages"][1]}.items()


@pytest.mark.e2e
def test_a_handoff_is_what_run_prints(capsys):
    from wse_emu.sim.runner import handoff_for, kv_handoff

    program = api.compile("tiny", "mesh16", plan="disaggregated")
    handoff = kv_handoff(program, *handoff_for(program, None, 64), 64)
    assert handoff.to_json() == _printed_json(capsys, "run", "tiny", "--fabric", "mesh16",
                                              "--plan", "disaggregated", "--phase", "handoff",
                                              "--tokens", "64")
    assert repr(handoff).startswith("HandoffRun('prefill0' -> 'decode0', KV of 64 tokens")


@pytest.mark.e2e
def test_serve_and_experiment_return_what_the_commands_print(tmp_path):
    program = api.compile("tiny", "mesh16", region=(8, 8))
    served = api.serve(program, str(SMALL_CHAT), cache_dir=tmp_path, ttft_s=1.0, tpot_s=1.0)
    result, metrics = served.result, served.metrics
    assert served.report.to_json()["workload"] == result.workload
    assert metrics.requests == len(result.tokens) == 40
    assert metrics.slo_attainment == 1.0
    assert repr(metrics).startswith("RunMetrics(40 requests over ")
    space = Space(copies=(1,), prefill_tile=(64,), token_budget=(64,), interleave=(1,),
                  max_running=(0,), batch_limit=(64,), window_s=0.0, layers_per_stage="own")
    data = api.experiment(api.ExperimentSpec(
        "tiny", api.Load(str(SMALL_CHAT)), api.Targets(0.05, 0.001), api.Hardware("mesh16"),
        space, api.Execution(workers=1, cache_dir=tmp_path)))
    assert {c.plan for c in data.final} == {"colocated", "disaggregated"}
    assert data.comparison.goodput_ratio > 0
    assert repr(data).startswith("ExperimentReport(tiny on 1 x mesh16, workload ")
    # Its JSON is what the command prints, and reads back as the same report.
    written = json.loads(json.dumps(data.to_json()))
    assert ExperimentReport.from_json(written) == data
    assert ExperimentReport.from_json(written).to_json() == written
    with pytest.raises(UserError, match="systems"):
        api.experiment(api.ExperimentSpec(
            "llama-3.1-70b", api.Load(str(SMALL_CHAT)), api.Targets(1, 0.01), space=space,
            execution=api.Execution(workers=1, cache_dir=tmp_path)))


def test_generate_computes_through_the_tiles():
    program = api.compile("tiny", "mesh16", region=(8, 8))
    out = api.generate(program, [1, 2, 3], 4)
    assert len(out.generated_ids) == 4


@pytest.mark.e2e
def test_an_experiment_held_at_the_median_says_so_throughout(tmp_path):
    from wse_emu.cli.experiment_cmd import render
    from wse_emu.visualize.curves import throughput_vs_tpot

    space = Space(copies=(1,), prefill_tile=(64,), token_budget=(64,), interleave=(1,),
                  max_running=(0,), batch_limit=(64,), window_s=0.0, layers_per_stage="own")
    data = api.experiment(api.ExperimentSpec(
        "tiny", api.Load(str(SMALL_CHAT)), api.Targets(0.05, 0.001, percentile=50),
        api.Hardware("mesh16"), space, api.Execution(workers=1, cache_dir=tmp_path)))
    assert (data.targets.at, data.targets.attainment) == ("p50", 0.5)
    written = json.loads(json.dumps(data.to_json()))
    assert "tpot_p50_s" in written["targets"]
    assert ExperimentReport.from_json(written) == data
    text = render(data)
    assert "targets: p50 TTFT" in text and "p50 TPOT" in text
    best = data.final[0]
    assert seconds(best.tpot_p50_s) in text.split("p50 TPOT", 2)[2].splitlines()[0]
    assert throughput_vs_tpot(data, tmp_path / "curve")[0].exists()


def test_the_experiments_are_imported_only_when_first_asked_for():
    """A compile or a serve does not pay for importing the experiments; every name the face
    exports resolves, and an experiment's annotations resolve in a process that has not asked
    for any of them (a spec made from its own module)."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from wse_emu import api\n"
        "assert 'wse_emu.experiments.run' not in sys.modules\n"
        "from wse_emu.experiments.spec import FrontierSpec\n"
        "from wse_emu.util.checks import type_hints\n"
        "hints = type_hints(vars(api)['frontier'].__wrapped__)\n"
        "assert hints['spec'] is FrontierSpec, hints\n"
        "assert set(api.__all__) <= set(dir(api))\n"
        "assert all(getattr(api, name) is not None for name in api.__all__)\n"
        "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert out.stdout.strip() == "ok", out.stderr[-2000:]


def test_serving_from_cached_program_and_tables_imports_no_engine_or_compiler(tmp_path):
    """A serve whose program and stage tables are cached pays for neither the compiler nor the
    engines under it (the stage graphs, the kernels' patterns): its start-up is what a user
    waits for each time. The first serve, in another process, fills both caches."""
    import os
    import subprocess
    import sys

    serve = ("import sys\nfrom wse_emu import api\n"
             "program = api.compile('tiny', 'mesh16')\n"
             "run = api.serve(program, 'chat', requests=20)\n"
             "assert run.metrics.requests == 20 and run.metrics.refused == 0\n"
             "heavy = sorted(m for m in sys.modules if m.startswith(("
             "'wse_emu.engines', 'wse_emu.kernels.', 'wse_emu.compiler.mapper', "
             "'wse_emu.experiments')))\n"
             "print(heavy)\n")
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    first = subprocess.run([sys.executable, "-c", serve], capture_output=True, text=True,
                           env=env, timeout=600)
    assert first.returncode == 0, first.stderr[-2000:]
    assert "wse_emu.engines.fast" in first.stdout  # it compiled and timed the tables
    again = subprocess.run([sys.executable, "-c", serve], capture_output=True, text=True,
                           env=env, timeout=600)
    assert again.returncode == 0, again.stderr[-2000:]
    assert again.stdout.strip().splitlines()[-1] == "[]"
