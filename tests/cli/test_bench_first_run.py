"""``wse-emu bench first-run``: both of its processes see the same Numba cache folder, a new
one, never the one this process uses, so that the first compiles everything and the second
loads it; the goal is judged on every step of the first."""

import os

import wse_emu.cli.bench as bench


def test_both_runs_share_a_fresh_numba_cache(monkeypatch):
    seen = []

    def child(module, payload, env=None):
        seen.append((module, env["NUMBA_CACHE_DIR"], os.listdir(env["NUMBA_CACHE_DIR"])))
        return {"seconds": {"the fast engine": 20.0, "the serving loop": 5.0},
                "peak_rss_mib": 100.0}

    monkeypatch.setattr(bench, "child", child)
    monkeypatch.setenv("NUMBA_CACHE_DIR", "/somewhere/else")
    out = bench.run_first_run()
    assert [m for m, _, _ in seen] == ["first_run_case", "first_run_case"]
    assert seen[0][1] == seen[1][1] != "/somewhere/else"
    assert seen[0][2] == []  # empty when the first run starts
    assert not os.path.exists(seen[0][1])  # removed afterwards
    assert out["goal_met"] is True


def test_one_slow_step_misses_the_goal(monkeypatch):
    def child(module, payload, env=None):
        return {"seconds": {"the fast engine": 20.0, "the serving loop": 330.0},
                "peak_rss_mib": 100.0}

    monkeypatch.setattr(bench, "child", child)
    assert bench.run_first_run()["goal_met"] is False
