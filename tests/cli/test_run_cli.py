"""wse-emu run: steps, outputs, the KV handoff, and errors."""

import json
import subprocess
import sys

import numpy as np
import pytest

from wse_emu.cli.main import main
from wse_emu.compiler.mapper import compile_model
from wse_emu.compiler.options import CompileOptions
from wse_emu.hardware.fabric import ClusterSpec, load_fabric
from wse_emu.models.layer import MicroBatch
from wse_emu.models.load import load_model
from wse_emu.sim.runner import kv_handoff, run_region


def test_decode_step_json(capsys):
    assert main(["run", "tiny", "--fabric", "mesh8", "--region", "8x8", "--phase", "decode",
                 "--batch", "2", "--context", "100", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    step = d["step"]
    assert (step["phase"], step["batch"], step["context"], step["tiles"]) == ("decode", 2, 100, 1)
    assert 0 < d["compute_utilization"] < 1
    for s in d["stages"]:
        # A stage takes at least as long as any of its kernels' bound, and no kernel keeps a
        # PE busy for longer than the stage lasts.
        assert s["cycles"] >= max(s["kernel_bound_cycles_each"].values())
        assert max(s["kernel_busy_cycles"].values()) <= s["cycles"]
    # Pipelined, the slowest stage sets the pace: faster than one micro-batch at a time.
    assert d["tokens_per_s_pipelined"] > d["tokens_per_s_alone"]


def test_run_directory_outputs(tmp_path, capsys):
    compiled = tmp_path / "compiled"
    assert main(["compile", "tiny", "--fabric", "mesh8", "--region", "8x8", "-o",
                 str(compiled)]) == 0
    out = tmp_path / "run"
    assert main(["run", str(compiled), "--phase", "prefill", "--tokens", "32", "--engine",
                 "cycle", "-o", str(out)]) == 0
    capsys.readouterr()
    with np.load(out / "counters.npz") as npz:
        busy = npz["pe_busy_cycles"]
        links = npz["link_wavelets_nesw"]
        assert busy.shape == (1, 8, 8) and links.shape == (1, 8, 8, 4)
        assert busy.sum() > 0 and links.sum() > 0
        assert "sram_weights" in npz.files
    trace = json.loads((out / "timeline.json").read_text())
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert {e["name"] for e in spans} >= {"stage 0", "stage 1", "q_proj", "attention"}
    results = json.loads((out / "results.json").read_text())
    assert results["engine"] == "cycle" and results["step"]["tiles"] == 4


@pytest.mark.e2e
def test_kv_handoff_on_the_wafer_and_between_systems():
    wse3 = load_fabric("wse3")
    model = load_model("llama-3.2-1b")
    one = compile_model(model, ClusterSpec(wse3, 1), CompileOptions(plan="disaggregated",
                                                                     region=(377, 585)))
    h = kv_handoff(one, "prefill0", "decode0", 1024)
    assert h.kv_bytes == 1024 * model.kv_bytes_per_token()
    assert not h.offwafer
    # No faster than every row of the wafer carrying 4 bytes a cycle across the cut.
    assert h.cycles >= h.kv_bytes / (wse3.height * wse3.link_bytes_per_cycle)
    two = compile_model(model, ClusterSpec(wse3, 2), CompileOptions(plan="disaggregated",
                                                                     prefill_systems=1))
    h2 = kv_handoff(two, "prefill0", "decode0", 1024)
    assert h2.offwafer
    assert h2.cycles == int(np.ceil(h2.kv_bytes / wse3.offwafer_bytes_per_cycle())) + 4


@pytest.mark.parametrize("args,needle", [
    (["run", "llama-3.1-8b", "--engine", "cycle"], "use --engine fast"),
    (["run", "tiny", "--fabric", "mesh8", "--phase", "prefill", "--tokens", "300",
      "--tiles", "1000"], "--tiles must be at most 128"),
    (["run", "tiny", "--fabric", "mesh8", "--context", "10000"], "do not fit the KV cache"),
    (["run", "llama-3.1-8b", "--plan", "disaggregated", "--phase", "handoff",
      "--region-name", "decode0"], "starts from a prefill region"),
    (["noc", "--seed", "-1"], "--seed must be at least 0"),
    (["noc", "--warmup", "-5"], "--warmup must be at least 0"),
    (["noc", "--queue", "100000000"], "--queue must be at most 1024"),
    (["run", "tiny", "--fabric", "mesh8", "--phase", "handoff"], "needs a disaggregated"),
    (["run", "tiny", "--fabric", "mesh8", "--batch", "0"], "--batch must be at least 1"),
    (["run", "tiny", "--fabric", "mesh8", "--region-name", "nowhere"], "no region named"),
])
@pytest.mark.e2e
def test_run_errors_are_one_line(args, needle):
    proc = subprocess.run([sys.executable, "-m", "wse_emu.cli.main", *args],
                          capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and needle in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.e2e
def test_missing_program_directory(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "wse_emu.cli.main", "run", str(tmp_path)],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "no program.json" in proc.stderr


@pytest.mark.e2e
def test_tied_embedding_lookup_is_timed_before_the_first_stage():
    p = compile_model(load_model("qwen2.5-0.5b"), ClusterSpec(load_fabric("wse3"), 1))
    run = run_region(p, "mixed0", MicroBatch("decode", batch=1, context=256))
    assert run.extra["embedding_cycles"] > 0
    assert run.transfers[0] == run.extra["embedding_cycles"] \
        + run.extra["embedding_transfer_cycles"] > 0


def test_noc_checks_conservation_on_every_run(capsys):
    """The command reports a conservation count only because it ran the check; the library
    says None when it did not."""
    from wse_emu.sim.noc import run_noc

    assert main(["noc", "--mesh", "4", "--rate", "0.1", "--window", "500", "--json"]) == 0
    run = json.loads(capsys.readouterr().out)["runs"][0]
    assert run["conservation_violations"] == 0
    assert run_noc(4, "uniform", 0.1, window=500).conservation_violations is None
