"""experiment disagg --vary: the experiment repeated at each value of one input, the TPOT
target in decode steps, the figure, and one-line errors for a bad --vary."""

import json
from dataclasses import replace

import numpy as np
import pytest
from helpers import QUICK_KNOBS, SMALL_CHAT

from wse_emu.cli.main import main
from wse_emu.errors import UserError
from wse_emu.experiments.comparison import vary_experiment
from wse_emu.experiments.goodput import Targets
from wse_emu.experiments.sensitivity import parse_vary, scaled
from wse_emu.experiments.setup import Job
from wse_emu.hardware.fabric import ClusterSpec, load_fabric
from wse_emu.serving.workload import WorkloadSpec, generate


@pytest.mark.parametrize("text", ["tpot", "speed=1,2", "tpot=", "tpot=a,b", "tpot=0,1",
                                  "systems=1.5"])
def test_bad_vary_is_refused(text):
    with pytest.raises(UserError):
        parse_vary(text)


def test_scaling_keeps_at_least_one_token():
    spec = WorkloadSpec(name="w", requests=50, prompt={"kind": "uniform", "low": 1, "high": 9},
                        output={"kind": "fixed", "value": 3}).validate("test")
    reqs = generate(spec)
    half = scaled(reqs, prompt=0.5, output=2.0)
    assert half.prompt_tokens.min() >= 1 and (half.output_tokens == 6).all()
    assert np.array_equal(half.arrival_s, reqs.arrival_s)


def test_vary_systems_draws_each_values_tuning_runs_afresh():
    spec = WorkloadSpec(name="w", requests=10, prompt={"kind": "fixed", "value": 8},
                        output={"kind": "fixed", "value": 4}).validate("test")
    seen = {}

    class Seen:  # an experiment's setup that records each value's job and stops there
        progress = None

        @staticmethod
        def run(job):
            seen[job.cluster.systems] = len(job.draws[0])
            raise UserError("enough: the draws were seen")

    cluster = ClusterSpec(load_fabric("wse3"), 1)
    job = Job(None, None, [generate(spec)], Targets(1.0, 0.01), cluster)
    data = vary_experiment(parse_vary("systems=1,3"), Seen, job,
                           lambda systems: [generate(replace(spec, requests=10 * systems))])
    assert seen == {1: 10, 3: 30}
    assert [r.error for r in data.sensitivity] == ["enough: the draws were seen"] * 2
    assert data.runs == [] and data.model is None
    assert data.to_json()["sensitivity"][0] == {"value": 1, "tpot_s": 0.01, "systems": 1,
                                                "error": "enough: the draws were seen"}
    seen.clear()
    vary_experiment(parse_vary("systems=1,3"), Seen, job)
    assert seen == {1: 10, 3: 10}  # without draws_for, every value starts from the same


@pytest.mark.e2e
def test_vary_tpot_reports_a_row_per_value_and_draws_the_figure(tmp_path, capsys):
    out = tmp_path / "run"
    args = ["experiment", "disagg", "tiny", "--fabric", "mesh16", "--workload", str(SMALL_CHAT),
            "--ttft-slo", "0.05", "--tpot-slo", "0.001", *QUICK_KNOBS, "--workers", "1",
            "--cache-dir", str(tmp_path / "cache"), "--vary", "tpot=0.0002,0.002",
            "-o", str(out), "--viz", "--json"]
    assert main(args) == 0
    data = json.loads(capsys.readouterr().out)
    rows = data["sensitivity"]
    assert [r["value"] for r in rows] == [0.0002, 0.002]
    for r, run in zip(rows, data["runs"]):
        assert r["tpot_in_decode_steps"] == pytest.approx(r["tpot_s"] / r["decode_step_s"])
        assert run["targets"]["tpot_p90_s"] == r["value"]
        assert r["goodput_ratio"] == run["comparison"]["goodput_ratio"]
    # A looser token-speed target can only let colocated serving sustain more (within the
    # search's 5% tolerance).
    assert rows[1]["max_rate_per_system"]["colocated"] >= 0.95 * \
        rows[0]["max_rate_per_system"]["colocated"]
    assert (out / "figures" / "sensitivity.png").stat().st_size > 0
