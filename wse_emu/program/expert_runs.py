"""Where a strip's runs of experts lie along it: a strip of a mixture-of-experts layer holds
``runs`` runs of experts one after another along K, each run reading the same input; its K is
split over the strip's columns by ``k_sizes``. The kernels' task graphs and the functional
engine both read these, so they live with the program format."""

from __future__ import annotations

import numpy as np


def run_columns(k_sizes: np.ndarray, runs: int, k_each: int) -> list[np.ndarray]:
    """Per run of experts, the columns along the strip holding its inputs (K = runs x k_each
    split by ``k_sizes``): one or more columns, a column shared where a run ends inside
    it."""
    bounds = np.concatenate([[0], np.cumsum(k_sizes)])
    first = np.searchsorted(bounds, np.arange(runs) * k_each, side="right") - 1
    last = np.searchsorted(bounds, (np.arange(runs) + 1) * k_each, side="left") - 1
    return [np.arange(a, b + 1) for a, b in zip(first, last)]


def run_root(run: np.ndarray, strip_root: int) -> int:
    """Where a run's partial sums meet: its end nearer the strip's root."""
    return len(run) - 1 if strip_root > 0 else 0


def input_share(k_sizes: np.ndarray, runs: int, k_each: int) -> np.ndarray:
    """(columns, runs): how many of each run's inputs each column holds."""
    bounds = np.concatenate([[0], np.cumsum(k_sizes)])
    lo = np.arange(runs) * k_each
    return np.clip(np.minimum(bounds[1:, None], lo[None, :] + k_each)
                   - np.maximum(bounds[:-1, None], lo[None, :]), 0, None)
