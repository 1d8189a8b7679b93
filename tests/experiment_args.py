"""Experiment arguments shared by the tests: every knob fixed at one value and no confirming
runs, so that a search of a tiny model takes seconds (the tests that tune a knob override it)."""

QUICK_KNOBS = ["--budgets", "64", "--copies", "1", "--prefill-tile", "64", "--interleave", "1",
               "--max-running", "0", "--batch-limit", "64", "--window-s", "0"]
