"""``wse-emu demo`` end to end, scaled down: the same code on a small model, fabric and
workload (the real demo, Llama-3.1-8B on a WSE-3, takes minutes), printing each section and
writing its runs, figures and report."""

from dataclasses import replace

import pytest

from wse_emu.cli import demo
from wse_emu.cli.main import main
from wse_emu.experiments.frontier import VendorSpeed
from wse_emu.models.layer import MicroBatch


@pytest.mark.e2e
def test_demo_prints_each_section_and_writes_its_report(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(demo, "DEFAULT_MODEL", "tiny")
    monkeypatch.setattr(demo, "DEFAULT_FABRIC", "mesh32")
    monkeypatch.setattr(demo, "DECODE", MicroBatch("decode", batch=1, context=256))
    monkeypatch.setattr(demo, "WORKLOAD", {
        **demo.WORKLOAD, "requests": 40,
        "prompt": {"kind": "lognormal", "median": 100, "sigma": 0.7, "low": 8, "high": 300},
        "output": {"kind": "lognormal", "median": 20, "sigma": 0.7, "low": 1, "high": 100}})
    monkeypatch.setattr(demo, "SPACE", replace(demo.SPACE, prefill_tile=(64,), interleave=(1,),
                                               policy=("interleaved",), window_s=0.0))
    # The tiny model has no published vendor speed: one as fast as a lone step allows.
    monkeypatch.setattr(demo, "vendor_speed", lambda name: VendorSpeed(10_000.0, "a test"))
    out = tmp_path / "demo"
    assert main(["demo", "-o", str(out), "--cache-dir", str(tmp_path / "cache")]) == 0
    text = capsys.readouterr().out
    for section in ("wse-emu demo:", "One decode step", "Stage-time tables: not cached yet",
                    "The disaggregation experiment", "Computed through the tiles", "report:",
                    "The answer on this workload, two ways", "at the vendor's speed, 10,000 "
                    "tokens/s per user", "high-speed token capacity", "goodput, the highest"):
        assert section in text
    assert text.index("One decode step") < text.index("The disaggregation experiment")
    assert (out / "report.html").exists() and (out / demo.MARKER).exists()
    for run in ("colocated-decode", "disaggregated-decode", "experiment"):
        assert any((out / run / "figures").glob("*.png")), run
    # A second demo replaces the first's output, and finds its tables cached.
    assert main(["demo", "-o", str(out), "--cache-dir", str(tmp_path / "cache")]) == 0
    assert "Stage-time tables: cached" in capsys.readouterr().out
