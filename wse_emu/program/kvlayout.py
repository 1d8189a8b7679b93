"""Where a stage keeps its KV cache: the rule the compiler plans by, the timed decode pattern
assumes and the functional engine stores by.

A stage's grid is (L columns along its long side) x (s rows across it). Each row holds a slice
of the K and V features (all KV heads' features split evenly over the rows, as the k and v
edges hand them over); each column holds a share of every sequence's cached tokens, all rows
of a column the same tokens. New tokens enter at one edge column and the oldest move one
column on (WaferLLM's shift-based cache), so the columns' shares stay within one token of each
other while every column has room; a column full to its tightest PE takes no more, and the
others take the rest.
"""

from __future__ import annotations

import numpy as np

from wse_emu.util.splits import even_split


def row_features(kv_size: int, rows: int) -> np.ndarray:
    """K (and V) features each row holds."""
    return even_split(kv_size, rows)


def token_bytes(kv_size: int, rows: int, layers: int, dtype_bytes: int) -> np.ndarray:
    """Bytes one cached token takes on a PE of each row: its K and V slice, every layer."""
    return 2 * row_features(kv_size, rows) * layers * dtype_bytes


def column_capacity(free_bytes: np.ndarray, kv_size: int, layers: int,
                    dtype_bytes: int) -> np.ndarray:
    """Tokens each column can hold: ``free_bytes`` is (L, s), the bytes each PE has left;
    a column holds as many tokens as its tightest PE (with features) allows."""
    length, rows = free_bytes.shape
    per_token = token_bytes(kv_size, rows, layers, dtype_bytes)
    with_features = per_token > 0
    if not with_features.any() or layers == 0:
        return np.zeros(length, dtype=np.int64)
    tokens = free_bytes[:, with_features] // per_token[None, with_features]
    return tokens.min(axis=1).astype(np.int64)


def column_counts(tokens: int, capacity: np.ndarray) -> np.ndarray:
    """How many of ``tokens`` each column holds: equal shares (within one) up to each column's
    capacity; what a full column cannot take goes to the others."""
    capacity = np.asarray(capacity, dtype=np.int64)
    if tokens > int(capacity.sum()):
        raise ValueError(f"{tokens} tokens exceed the stage's {int(capacity.sum())}")
    counts = np.zeros(len(capacity), dtype=np.int64)
    left = tokens
    open_ = capacity > 0
    while left > 0:
        idx = np.flatnonzero(open_ & (counts < capacity))
        share = even_split(left, len(idx))
        take = np.minimum(share, capacity[idx] - counts[idx])
        counts[idx] += take
        left -= int(take.sum())
    return counts


def column_of_positions(tokens: int, capacity: np.ndarray) -> np.ndarray:
    """The column of each cached position 0 .. tokens-1, with the entry at column 0: the
    newest tokens nearest the entry, the oldest shifted farthest."""
    counts = column_counts(tokens, capacity)
    # Oldest first: the farthest column holds the oldest positions.
    return np.repeat(np.arange(len(counts))[::-1], counts[::-1])
