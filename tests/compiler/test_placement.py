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


def _numpy_score(scorer, order, roots):
    """The score as numpy's arrays compute it (the scorer's arithmetic, array by array): the
    oracle the plain-Python scorer must equal to the bit."""
    import numpy as np

    src, dst, start = scorer.ports(order, roots)
    src, dst = np.array(src, dtype=float), np.array(dst, dtype=float)
    nbytes = np.array([t.nbytes for t in scorer.transfers], dtype=float)
    length = scorer.length
    spread = np.isnan(src) | np.isnan(dst)
    point = np.where(np.isnan(src), dst, src)
    hops = np.where(spread, (point ** 2 + (length - 1 - point) ** 2) / (2 * max(length - 1, 1)),
                    np.abs(src - dst))
    bytes_hops = float((nbytes * hops).sum())
    ends = np.concatenate([src, dst])
    edges = np.array([start[n] for n in order], dtype=float)
    cand = np.unique(np.concatenate([edges, edges + [scorer.extents[n] for n in order],
                                     np.floor(ends[~np.isnan(ends)]) + 1]))
    cuts = cand[(cand > 0) & (cand < length)]
    if cuts.size == 0:
        return bytes_hops, 0.0, 0
    lo, hi = np.fmin(src, dst), np.fmax(src, dst)
    crossing = ((lo[:, None] < cuts[None, :]) & (cuts[None, :] <= hi[:, None])).astype(float)
    far = np.where(point[:, None] < cuts[None, :], (length - cuts[None, :]) / length,
                   cuts[None, :] / length)
    crossing = np.where(spread[:, None], far, crossing)
    loads = (nbytes[:, None] * crossing).sum(axis=0) / scorer.short
    return bytes_hops, float(loads.max()), cuts.size


def test_scorer_equals_numpy_arrays_to_the_bit():
    """Scored in plain Python, every arrangement scores as numpy's arrays score it, to the
    bit (so every annealing, and every program, is the same): random stages of up to 12
    strips and 40 transfers (point to point, to and from the whole stage, from the entry,
    to the exit), at random arrangements, a lone cut among them."""
    import random

    rng = random.Random(7)
    lone_cut = 0
    for _ in range(300):
        names = [f"s{i}" for i in range(rng.randint(1, 12))]
        extents = {n: rng.randint(1, 40) for n in names}
        ends = [*names, pl.STAGE]
        transfers = [pl.Transfer(rng.choice([*ends, pl.ENTRY]), rng.choice([*ends, pl.EXIT]),
                                 rng.randint(1, 10 ** rng.randint(1, 9)), f"d{k}",
                                 to_edge=rng.random() < 0.5)
                     for k in range(rng.randint(1, 40))]
        length = sum(extents.values())
        scorer = pl.StageScorer(names, extents, rng.randint(1, 400), transfers,
                                rng.uniform(0, length - 1), rng.uniform(0, length - 1))
        for _ in range(20):
            order = rng.sample(names, len(names))
            roots = {n: rng.random() < 0.5 for n in names}
            *expected, cuts = _numpy_score(scorer, order, roots)
            lone_cut += cuts == 1
            # (a transfer from the whole stage to itself has no distance: NaN in both)
            assert [repr(v) for v in scorer.score(order, roots)] == [repr(v) for v in expected]
    assert lone_cut > 0  # numpy's pairwise sum of a lone cut's column was met


def test_numpy_order_of_addition():
    """``_numpy_sum`` adds as numpy's ``sum`` of a float64 vector does, at every length (its
    eight running sums beyond seven values, its halves beyond 128)."""
    import random

    import numpy as np

    rng = random.Random(3)
    for n in range(300):
        values = [rng.uniform(0, 1) * 10 ** rng.randint(-3, 12) for _ in range(n)]
        assert pl._numpy_sum(values) == float(np.array(values, dtype=float).sum())


def test_a_lone_cut_is_summed_as_numpy_sums_it():
    """Where a stage has one cut, numpy sums its column pairwise, not in turn: a strip of
    three columns, a dozen transfers with the whole stage crossing its one cut (each adding
    a third of its bytes, so that the order of additions shows)."""
    import random

    rng = random.Random(11)
    differs = 0
    for _ in range(50):
        transfers = [pl.Transfer(pl.STAGE, "a", rng.randint(1, 10 ** 9), f"d{k}")
                     for k in range(12)]
        scorer = pl.StageScorer(["a"], {"a": 3}, 7, transfers, 1.5, 2.0)
        arrangement = (["a"], {"a": True})
        *expected, cuts = _numpy_score(scorer, *arrangement)
        assert cuts == 1 and list(scorer.score(*arrangement)) == expected
        in_turn = 0.0
        for t in transfers:
            in_turn += t.nbytes * ((3 - 2.0) / 3)
        differs += in_turn / 7 != expected[1]
    assert differs  # adding in turn would have missed
