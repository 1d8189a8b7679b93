"""Traces whose prompts come as prefix blocks: one JSON object a line, as the Mooncake project
publishes its production traces.

Each line holds ``timestamp`` (the arrival, in milliseconds from the trace's start),
``input_length`` and ``output_length`` (tokens), and ``hash_ids``: the prompt's blocks of
``block_tokens`` tokens (512 in the published traces), in order, each as an integer that
names the whole prefix up to and including it. Two requests whose lists start with the same k
ids share the KV cache of their first k blocks; that is all serving may reuse across requests
(``loops``: a region's prefix cache keeps blocks by these ids). Every line read is checked,
and a bad one refused with its line number and why, as a CSV trace's rows are.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from wse_emu.errors import ConfigError

SUFFIX = ".jsonl"
FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")
BLOCK_TOKENS = 512  # the published traces' block size


@dataclass(frozen=True)
class PrefixBlocks:
    """Requests' prefix blocks: request i's ids are ``ids[at[i]:at[i + 1]]``, numbered
    densely from 0 in the order first seen (equal ids, equal prefixes), of ``tokens`` tokens
    each (a prompt's last block may be shorter)."""

    ids: np.ndarray
    at: np.ndarray
    tokens: int

    def __len__(self) -> int:
        return len(self.at) - 1

    def of(self, i: int) -> np.ndarray:
        return self.ids[self.at[i]:self.at[i + 1]]

    def subset(self, keep: np.ndarray) -> "PrefixBlocks":
        """The blocks of the requests ``keep`` (a boolean mask) marks, numbered afresh."""
        rows = np.flatnonzero(keep)
        parts = [self.of(i) for i in rows]
        return numbered(parts, self.tokens)

    def distinct(self) -> int:
        return int(self.ids.max()) + 1 if len(self.ids) else 0


def shareable_tokens(blocks: PrefixBlocks, prompts: np.ndarray) -> int:
    """The prompt tokens a prefix cache could skip were it unbounded and every request
    finished before the next arrived: per request, its leading blocks some earlier request
    had, but its last token."""
    seen: set = set()
    total = 0
    for i in range(len(blocks)):
        ids = blocks.of(i).tolist()
        k = 0
        while k < len(ids) and ids[k] in seen:
            k += 1
        prompt = int(prompts[i])
        total += min(min(k * blocks.tokens, prompt), prompt - 1)
        seen.update(ids)
    return total


def numbered(parts: list, tokens: int) -> PrefixBlocks:
    """``PrefixBlocks`` of each request's ids in ``parts``, renumbered densely."""
    at = np.zeros(len(parts) + 1, dtype=np.int64)
    np.cumsum([len(p) for p in parts], out=at[1:])
    flat = np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)
    if len(flat):
        # Numbered by first appearance, so that a window's numbers do not depend on the rows
        # skipped before it.
        _, first, inverse = np.unique(flat, return_index=True, return_inverse=True)
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        flat = rank[inverse].astype(np.int64)
    return PrefixBlocks(flat, at, tokens)


def parsed_rows(lines, path: Path, block_tokens: int):
    """Each row of a block trace's ``lines`` (an iterator of (line number, text)), checked:
    (arrival s, prompt, output, hash ids), read one at a time as they are asked for."""
    last = None
    for number, text in lines:
        if not text.strip():
            continue
        row = _row(path, number, text, last, block_tokens)
        last = row[0]
        yield row


def _row(path: Path, line: int, text: str, last: float | None, block_tokens: int) -> tuple:
    """(arrival s, prompt, output, hash ids) of one line, checked."""
    where = f"{path}: line {line}"
    try:
        row = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{where}: not a JSON object ({exc.msg})") from None
    if not isinstance(row, dict):
        raise ConfigError(f"{where}: not a JSON object")
    missing = [name for name in FIELDS if name not in row]
    if missing:
        raise ConfigError(f"{where}: no {', '.join(missing)} (each line needs "
                          f"{', '.join(FIELDS)})")
    t, p, o, ids = (row[name] for name in FIELDS)
    if not all(_is_int(v) for v in (p, o)) or not _is_number(t):
        raise ConfigError(f"{where}: timestamp must be a number and the lengths whole numbers")
    if not np.isfinite(t) or t < 0 or p < 1 or o < 1:
        raise ConfigError(f"{where}: times must be >= 0 and token counts >= 1")
    if last is not None and t / 1000.0 < last:
        raise ConfigError(f"{where}: timestamp {t} is before the previous one "
                          f"({last * 1000.0:g}); a trace must be sorted by time")
    if not isinstance(ids, list) or not all(_is_int(v) and v >= 0 for v in ids):
        raise ConfigError(f"{where}: hash_ids must be a list of whole numbers >= 0")
    blocks = -(-p // block_tokens)
    if len(ids) != blocks:
        raise ConfigError(f"{where}: {len(ids)} hash_ids for a prompt of {p:,} tokens, "
                          f"which makes {blocks} blocks of {block_tokens} (is `block_tokens` "
                          "the trace's?)")
    if len(set(ids)) != len(ids):
        raise ConfigError(f"{where}: hash_ids repeats an id; each names a different prefix")
    return t / 1000.0, p, o, ids


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
