"""Experiment arguments shared by the tests: every knob fixed at one value, each layout at
its own pipeline depth and no confirming runs, so that a search of a tiny model takes seconds
(the tests that tune a knob override it); and the rate searches of a list of configurations,
run to their answers."""

from wse_emu.runtime.experiment import Search, run_searches

QUICK_KNOBS = ["--token-budget", "64", "--copies", "1", "--prefill-tile", "64", "--interleave", "1",
               "--max-running", "0", "--batch-limit", "64", "--window-s", "0",
               "--layers-per-stage", "own"]


def search_all(configs, run_points, tolerance: float = 0.05) -> list:
    """Every configuration's rate search; ``run_points(jobs)`` evaluates (index, factor)
    pairs."""
    searches = [Search(c) for c in configs]
    run_searches(dict(enumerate(searches)), run_points, tolerance=tolerance)
    return searches
