"""Sweeps: every combination of a base configuration's axes, keyed, resumable."""
