"""Placement inside a stage: the scorer against hand counts, and the optimizer's guarantees."""

import pytest

from wse_emu.compiler import placement as pl
from wse_emu.compiler.geometry import even_split, grid_shape, proportional_split


def test_scorer_point_to_point_by_hand():
    t = [pl.Transfer("a", "b", 100, "x")]
    scorer = pl.StageScorer(["a", "b"], {"a": 2, "b": 4}, short=5, transfers=t, entry=0, exit_=5)
    # a occupies columns 0-1 with its root at 1; b occupies 2-5, its body centre is 3.5.
    bytes_hops, load = scorer.score(["a", "b"], {"a": True, "b": True})
    assert bytes_hops == pytest.approx(100 * 2.5)
    assert load == pytest.approx(100 / 5)  # every cut between 1 and 3 carries it on 5 lanes
    # Root at the far end of a: one more hop.
    bytes_hops, _ = scorer.score(["a", "b"], {"a": False, "b": True})
    assert bytes_hops == pytest.approx(100 * 3.5)


def test_scorer_stage_wide_transfer_uses_the_mean_distance():
    t = [pl.Transfer("a", pl.STAGE, 10, "q")]
    scorer = pl.StageScorer(["a", "b"], {"a": 1, "b": 4}, short=1, transfers=t, entry=0, exit_=4)
    bytes_hops, load = scorer.score(["a", "b"], {"a": True, "b": True})
    # From column 0 to a uniformly chosen column of 0..4: mean distance 2.
    assert bytes_hops == pytest.approx(10 * 2.0)
    assert load == pytest.approx(10 * 4 / 5)


def test_annealing_never_worse_than_its_start_and_is_deterministic():
    names = ["a", "b", "c", "d"]
    t = [pl.Transfer("a", "d", 50, "x"), pl.Transfer("d", "b", 50, "y"),
         pl.Transfer("b", "c", 5, "z")]
    scorer = pl.StageScorer(names, {n: 3 for n in names}, short=2, transfers=t, entry=0, exit_=11)
    start = (names, {n: True for n in names})
    o1, r1 = pl.anneal(scorer, *start, steps=400, seed=3)
    o2, r2 = pl.anneal(scorer, *start, steps=400, seed=3)
    assert (o1, r1) == (o2, r2)
    assert scorer.objective(o1, r1) < scorer.objective(*start)


def test_proportional_split_respects_minimums_and_total():
    sizes = proportional_split(100, [1, 1, 8], minimum=[20, 1, 1])
    assert sizes.sum() == 100 and sizes[0] >= 20
    assert list(proportional_split(10, [1, 1, 1])) in ([4, 3, 3], [3, 4, 3], [3, 3, 4])
    with pytest.raises(ValueError):
        proportional_split(5, [1, 1], minimum=[3, 3])


def test_even_split_and_grid_shape():
    assert list(even_split(10, 3)) == [3, 3, 4]
    assert grid_shape(4, 755, 1170) == (2, 2)
    assert grid_shape(1, 755, 1170) == (1, 1)
