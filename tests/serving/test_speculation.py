"""How many tokens a verify step yields (``serving.speculation``): the formula, the draws and
the acceptance given as a table."""

import numpy as np
import pytest

from wse_emu.errors import UserError
from wse_emu.serving.speculation import (
    Speculation,
    acceptance_for,
    read_acceptance_table,
    tokens_per_step,
)


@pytest.mark.parametrize("k, a", [(1, 0.5), (4, 0.8), (8, 0.6), (3, 0.95)])
def test_drawn_tokens_per_step_match_the_formula(k, a):
    spec = Speculation(k, a, seed=3)
    runs, begin = spec.runs(np.full(20_000, 11))
    tokens = 1 + runs.astype(np.float64)
    mean, sd = tokens.mean(), tokens.std()
    expected = (1 - a ** (k + 1)) / (1 - a)
    assert spec.mean_tokens_per_step == pytest.approx(expected)
    # Within five standard errors of the mean.
    assert abs(mean - expected) < 5 * sd / np.sqrt(len(tokens))
    assert runs.min() >= 0 and runs.max() <= k
    assert begin[-1] == len(runs) == 20_000 * 10


def test_the_ends_of_the_acceptance():
    assert tokens_per_step(4, 0.0) == 1 and tokens_per_step(4, 1.0) == 5
    runs, _ = Speculation(4, 0.0).runs(np.array([5, 9]))
    assert not runs.any()
    runs, _ = Speculation(4, 1.0).runs(np.array([5, 9]))
    assert (runs == 4).all()


def test_same_seed_same_runs_and_another_seed_others():
    a, _ = Speculation(4, 0.7, seed=1).runs(np.full(100, 50))
    b, _ = Speculation(4, 0.7, seed=1).runs(np.full(100, 50))
    c, _ = Speculation(4, 0.7, seed=2).runs(np.full(100, 50))
    assert np.array_equal(a, b) and not np.array_equal(a, c)


def test_each_request_has_a_run_per_token_after_its_first():
    runs, begin = Speculation(2, 0.5).runs(np.array([1, 4, 2]))
    assert begin.tolist() == [0, 0, 3, 4] and len(runs) == 4


def test_acceptance_solved_from_a_mean():
    for k, a in ((3, 0.4), (6, 0.85)):
        assert acceptance_for(k, tokens_per_step(k, a)) == pytest.approx(a, abs=1e-9)
    with pytest.raises(UserError, match="lies between 1 and 5"):
        acceptance_for(4, 5.5)


def test_acceptance_table(tmp_path):
    path = tmp_path / "acc.csv"
    path.write_text("draft_tokens,mean_tokens_per_step\n2,2.2\n4,3.1\n")
    assert read_acceptance_table(path) == {2: 2.2, 4: 3.1}
    spec = Speculation.of(4, path)
    assert spec.mean_tokens_per_step == pytest.approx(3.1)
    with pytest.raises(UserError, match="no row for 3 drafted tokens"):
        Speculation.of(3, path)


@pytest.mark.parametrize("text, message", [
    ("k,mean\n2,2\n", "starts with the header"),
    ("draft_tokens,mean_tokens_per_step\n2,x\n", "line 2: expected a whole number"),
    ("draft_tokens,mean_tokens_per_step\n2,4.5\n", "not possible with 2 drafted"),
    ("draft_tokens,mean_tokens_per_step\n2,2\n2,2.5\n", "each listed once"),
    ("draft_tokens,mean_tokens_per_step\n", "no rows"),
])
def test_a_bad_table_is_refused_by_line(tmp_path, text, message):
    path = tmp_path / "acc.csv"
    path.write_text(text)
    with pytest.raises(UserError, match=message):
        read_acceptance_table(path)


@pytest.mark.parametrize("k, a, message", [
    (0, 0.5, "`draft_tokens` must be at least 1"),
    (17, 0.5, "at most 16"),
    (4, 1.5, "`acceptance` must be a probability"),
    (4, True, "`acceptance` must be a probability"),
    (4, "x", "`acceptance` must be a probability"),
])
def test_bad_speculation_is_refused(k, a, message):
    with pytest.raises(UserError, match=message):
        Speculation(k, a)
