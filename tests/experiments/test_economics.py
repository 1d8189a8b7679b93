"""Energy and cost per output token: from the systems' wall power (a fabric field, cited or
absent) and a price per system-hour the user gives; never a default price."""

import json

import pytest
from helpers import QUICK_KNOBS

from wse_emu.cli.main import main
from wse_emu.experiments.comparison import economics
from wse_emu.hardware.fabric import load_fabric


def test_energy_and_cost_follow_from_power_price_and_rate():
    out = economics(tokens_per_s=1000.0, systems=2, power_w=20000.0, price=36.0)
    assert out["energy_per_output_token_j"] == pytest.approx(40.0)  # 40 kW over 1000 tok/s
    # 2 systems x 36 per hour = 0.02 per second, over 1000 tokens/s, per million tokens
    assert out["cost_per_million_output_tokens"] == pytest.approx(20.0)
    assert economics(1000.0, 1, 0.0, None) == {}


def test_only_a_cited_fabric_states_its_power():
    assert load_fabric("wse3").system_power_w > 0
    assert load_fabric("wse2").system_power_w == 0


@pytest.mark.e2e
def test_the_experiment_prices_its_best_configurations(tmp_path, capsys):
    path = tmp_path / "w.yaml"
    path.write_text("version: 1\nname: w\narrival: poisson\nrate: 500\nrequests: 40\n"
                    "prompt: {kind: fixed, value: 100}\noutput: {kind: fixed, value: 10}\n")
    args = ["experiment", "disagg", "tiny", "--fabric", "mesh16", "--workload", str(path),
            "--ttft-slo", "0.05", "--tpot-slo", "0.001", *QUICK_KNOBS, "--workers", "1",
            "--cache-dir", str(tmp_path / "cache"), "--set", "system_power_w=15000",
            "--price-per-system-hour", "10"]
    assert main(args + ["--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    for c in data["configurations"]:
        if c["max_rate_per_s"] > 0:
            assert c["energy_per_output_token_j"] == pytest.approx(
                15000 / c["output_tokens_per_s"])
            assert c["cost_per_million_output_tokens"] == pytest.approx(
                10 / 3600 / c["output_tokens_per_s"] * 1e6)
    assert main(args) == 0
    assert "per million output tokens" in capsys.readouterr().out
    assert main(args[:-2] + ["--price-per-system-hour", "0"]) == 2
