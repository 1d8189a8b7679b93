"""Expert routing in a drawn step: uniform or Zipf-skewed, seeded, each token's experts
distinct; skew shows as load imbalance."""

import json

import numpy as np
import pytest

from wse_emu.cli.main import main
from wse_emu.errors import UserError
from wse_emu.models.layer import expected_experts
from wse_emu.models.routing import Routing, load_summary, parse_routing


def test_each_token_takes_top_k_distinct_experts():
    picks = Routing("skewed", 1.5, seed=3).draw(16, 4, 200)
    assert picks.shape == (200, 4)
    assert all(len(set(row)) == 4 for row in picks.tolist())
    assert picks.min() >= 0 and picks.max() < 16


def test_draws_are_seeded():
    a, b = Routing(seed=1), Routing(seed=2)
    assert np.array_equal(a.draw(32, 4, 50), a.draw(32, 4, 50))
    assert not np.array_equal(a.draw(32, 4, 50), b.draw(32, 4, 50))


def test_uniform_routing_reaches_the_expected_number_of_experts():
    # Averaged over seeds, the experts that receive tokens match the closed form the op costs
    # use: each expert missed by a token with probability 1 - k / E.
    for tokens in (1, 8, 64):
        active = np.mean([np.count_nonzero(Routing(seed=s).loads(128, 8, tokens))
                          for s in range(40)])
        assert active == pytest.approx(expected_experts(128, 8, tokens), rel=0.03)


def test_skew_crowds_tokens_onto_fewer_experts():
    rows = [load_summary(Routing("skewed", s, seed=0) if s else Routing(), 128, 8, 64)
            for s in (0.0, 1.0, 2.0)]
    assert rows[0]["active_experts"] > rows[1]["active_experts"] > rows[2]["active_experts"]
    assert rows[0]["busiest_tokens"] < rows[1]["busiest_tokens"] <= rows[2]["busiest_tokens"]
    # Every token is counted k times, whatever the routing.
    for row in rows:
        assert row["active_experts"] * row["mean_tokens_per_active_expert"] == \
            pytest.approx(64 * 8)


def test_popularity_is_a_distribution_and_skew_zero_is_uniform():
    p = Routing("skewed", 1.2, seed=5).popularity(10)
    assert p.sum() == pytest.approx(1.0) and p.max() / p.min() == pytest.approx(10 ** 1.2)
    assert np.allclose(Routing("skewed", 0.0).popularity(10), 0.1)


@pytest.mark.parametrize("text", ["zipf", "skewed", "skewed:", "skewed:x", "skewed:-1",
                                  "uniform:2", "skewed:nan"])
def test_bad_routing_is_refused(text):
    with pytest.raises(UserError, match="routing|skew"):
        parse_routing(text)


def test_inspect_reports_a_drawn_steps_expert_loads(capsys):
    assert main(["inspect", "qwen3-30b-a3b", "--batch", "64", "--routing", "skewed:1",
                 "--json"]) == 0
    loads = json.loads(capsys.readouterr().out)["expert_loads"]
    assert loads == load_summary(Routing("skewed", 1.0), 128, 8, 64)
    assert main(["inspect", "llama-3.1-8b", "--json"]) == 0
    assert "expert_loads" not in json.loads(capsys.readouterr().out)


def test_inspect_costs_expert_weights_by_the_drawn_step(capsys):
    totals = {}
    for routing in ("uniform", "skewed:2"):
        assert main(["inspect", "qwen3-30b-a3b", "--batch", "64", "--routing", routing,
                     "--json"]) == 0
        data = json.loads(capsys.readouterr().out)
        gate = next(r for r in data["ops"] if r["node"] == "L0.experts_gate")
        per_expert = 2048 * 768 * 2
        assert gate["weight_bytes"] == per_expert * data["expert_loads"]["active_experts"]
        totals[routing] = data["total"]["bytes"]
    assert totals["skewed:2"] < totals["uniform"]  # fewer experts reached, fewer bytes read


def test_routing_on_a_dense_model_is_refused(capsys):
    assert main(["inspect", "llama-3.1-8b", "--routing", "skewed:1"]) == 2
    assert "apply to a mixture of experts" in capsys.readouterr().err


def test_a_negative_routing_seed_is_refused_in_one_line(capsys):
    from wse_emu.cli.main import main

    assert main(["inspect", "gpt-oss-20b", "--routing-seed", "-1"]) == 2
    err = capsys.readouterr().err
    assert "--routing-seed must be 0 or more" in err and err.count("\n") == 1
