"""Speculative decoding as serving sees it: how many tokens each verify step yields.

A draft proposes ``K`` tokens after a sequence's next one; the target checks all ``K + 1`` in one
verify step and keeps the drafted ones up to the first it rejects, plus a token of its own (the
correction, or the one after the last drafted when all are kept). With each drafted token
accepted with probability ``A``, independently of the others (the usual model of the field's
analyses, e.g. Leviathan et al. 2023), a step yields ``1 + min(K, R)`` tokens, where ``R``, the
run of acceptances before the first rejection, has ``P(R >= j) = A**j``; its mean is
``(1 - A**(K + 1)) / (1 - A)``.

The acceptance is an input, never assumed: measured figures depend on the draft, the target and
the task (docs/speculative.md cites some). It is given as ``A`` or as a table of the mean tokens
per verify step measured at each ``K`` (the "average acceptance length" papers report), from
which the ``A`` that gives that mean at the ``K`` served is solved.

The runs are drawn before serving, one per possible step of every request, from their own seeded
generator, and both serving loops read the same integers: a request's tokens then arrive in
bursts, as they would, and TPOT and the inter-token latencies have the distribution they would
have.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from wse_emu.errors import UserError
from wse_emu.sim.runner import MAX_DRAFTED
from wse_emu.util.checks import whole

MAX_DRAFT_TOKENS = MAX_DRAFTED  # as many as the runner's verify step takes


def tokens_per_step(draft_tokens: int, acceptance: float) -> float:
    """Mean tokens a verify step yields: ``sum(A**j for j in 0..K)``."""
    if acceptance >= 1.0:
        return float(draft_tokens + 1)
    return (1.0 - acceptance ** (draft_tokens + 1)) / (1.0 - acceptance)


def acceptance_for(draft_tokens: int, mean_tokens: float) -> float:
    """The per-token acceptance whose mean tokens per verify step at ``draft_tokens`` is
    ``mean_tokens`` (between 1 and K + 1), by bisection: the mean rises with the acceptance."""
    if not 1.0 <= mean_tokens <= draft_tokens + 1:
        raise UserError(f"a mean of {mean_tokens:g} tokens per verify step is not possible with "
                        f"{draft_tokens} drafted tokens (it lies between 1 and "
                        f"{draft_tokens + 1})")
    low, high = 0.0, 1.0
    for _ in range(60):
        middle = (low + high) / 2
        if tokens_per_step(draft_tokens, middle) < mean_tokens:
            low = middle
        else:
            high = middle
    return (low + high) / 2


def read_acceptance_table(path: Path | str) -> dict[int, float]:
    """A CSV of ``draft_tokens,mean_tokens_per_step`` rows (a header line first): the mean
    tokens per verify step measured at each number of drafted tokens. Read once per version
    of the file: every serving run of an experiment asks for it."""
    path = Path(path)
    try:
        seen = path.stat()
    except OSError as exc:
        raise UserError(f"cannot read the acceptance table {path}: {exc}") from None
    return dict(_table(str(path), seen.st_mtime_ns, seen.st_size))


@lru_cache(maxsize=16)
def _table(name: str, mtime_ns: int, size: int) -> tuple:
    """The table at ``name`` as it was at (``mtime_ns``, ``size``), as (K, mean) pairs."""
    path = Path(name)
    try:
        with path.open(newline="", encoding="utf-8") as fh:
            rows = list(csv.reader(fh))
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read the acceptance table {path}: {exc}") from None
    if not rows or [c.strip() for c in rows[0]] != ["draft_tokens", "mean_tokens_per_step"]:
        raise UserError(f"{path}: an acceptance table starts with the header "
                        "'draft_tokens,mean_tokens_per_step'")
    table = {}
    for line, row in enumerate(rows[1:], start=2):
        try:
            k, mean = int(row[0]), float(row[1])
        except (ValueError, IndexError):
            raise UserError(f"{path}, line {line}: expected a whole number of drafted tokens "
                            f"and a mean, got {','.join(row)!r}") from None
        if not 1 <= k <= MAX_DRAFT_TOKENS or k in table:
            raise UserError(f"{path}, line {line}: drafted tokens {k} must be 1 to "
                            f"{MAX_DRAFT_TOKENS}, each listed once")
        acceptance_for(k, mean)  # refuses a mean no acceptance gives
        table[k] = mean
    if not table:
        raise UserError(f"{path}: no rows")
    return tuple(table.items())


@dataclass(frozen=True)
class Speculation:
    """Speculative decoding in a serving run: ``draft_tokens`` (K) drafted per verify step,
    each accepted with probability ``acceptance``, the runs drawn from ``seed``."""

    draft_tokens: int
    acceptance: float
    seed: int = 0

    def __post_init__(self):
        whole("draft_tokens", self.draft_tokens, 1)
        if self.draft_tokens > MAX_DRAFT_TOKENS:
            raise UserError(f"`draft_tokens` must be at most {MAX_DRAFT_TOKENS}, got "
                            f"{self.draft_tokens}")
        if isinstance(self.acceptance, bool) or not isinstance(self.acceptance, (int, float)) \
                or not 0.0 <= self.acceptance <= 1.0:
            raise UserError(f"`acceptance` must be a probability from 0 to 1, got "
                            f"{self.acceptance!r}")
        whole("seed", self.seed, 0)

    @classmethod
    def of(cls, draft_tokens: int, acceptance: float | Path | str, seed: int = 0):
        """From an acceptance given as a probability, or as an acceptance table's path (the
        mean at ``draft_tokens`` must be in it)."""
        if isinstance(acceptance, (str, Path)):
            table = read_acceptance_table(acceptance)
            if draft_tokens not in table:
                raise UserError(f"the acceptance table {acceptance} has no row for "
                                f"{draft_tokens} drafted tokens (it has "
                                f"{', '.join(map(str, sorted(table)))})")
            acceptance = acceptance_for(draft_tokens, table[draft_tokens])
        return cls(draft_tokens, acceptance, seed)

    @property
    def mean_tokens_per_step(self) -> float:
        return tokens_per_step(self.draft_tokens, self.acceptance)

    def runs(self, output_tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per request, the acceptance runs of its verify steps, at most one per token after
        its first: (runs, where each request's begin), runs as int8 capped at K."""
        steps = np.maximum(np.asarray(output_tokens, dtype=np.int64) - 1, 0)
        begin = np.zeros(len(steps) + 1, dtype=np.int64)
        np.cumsum(steps, out=begin[1:])
        rng = np.random.default_rng(self.seed)
        total = int(begin[-1])
        if self.acceptance >= 1.0:
            runs = np.full(total, self.draft_tokens, dtype=np.int64)
        elif self.acceptance <= 0.0:
            runs = np.zeros(total, dtype=np.int64)
        else:
            # numpy's geometric counts the trials to the first rejection, that one included.
            runs = rng.geometric(1.0 - self.acceptance, size=total) - 1
        return np.minimum(runs, self.draft_tokens).astype(np.int8), begin


def speculating(pool) -> tuple:
    """A pool's verify table and drafted tokens per step: (None, 0) for plain decode. A pool
    that speculates (``Pool.verify``) times a verify step's first tile with its decode table
    (the draft's steps before it, in the draft's stages at the front of its pipeline) and each
    later tile with ``verify``."""
    verify = getattr(pool, "verify", None)
    return (verify, int(pool.draft_tokens)) if verify is not None else (None, 0)


def draft_stages_of(pool) -> int:
    """How many of a speculating pool's first stages are its draft's (0 without one): their
    share of its decode stage-time is what drafting costs it (``busy_draft``)."""
    return int(getattr(pool, "draft_stages", 0)) if speculating(pool)[1] else 0


def acceptance_runs(requests, options) -> tuple[np.ndarray, np.ndarray]:
    """The acceptance runs both loops read (``Speculation.runs``), or none without
    speculation."""
    spec = options.speculation()
    if spec is None:
        return np.zeros(0, dtype=np.int8), np.zeros(len(requests) + 1, dtype=np.int64)
    return spec.runs(requests.output_tokens)


def bursts(gap_request: np.ndarray, gap_cycles: np.ndarray) -> np.ndarray:
    """Tokens per verify step as a run served them: every token after a request's first comes
    with a gap since the token before, and a verify step's tokens after its first come at
    once (a gap of zero), so a step's tokens are a positive gap and the zeros after it."""
    order = np.argsort(gap_request, kind="stable")  # each request's tokens in their order
    starts = np.flatnonzero(gap_cycles[order] > 0)
    return np.diff(np.append(starts, len(order)))


def speculation_report(spec: Speculation, gap_request: np.ndarray, gap_cycles: np.ndarray,
                       step: dict, draft: dict, regions: dict) -> dict:
    """What speculation did in a run: the acceptance it assumed, tokens per verify step (the
    formula's mean, and the run's mean and distribution), one step's time alone at a
    reference shape (``step``: the draft's K steps and the target's verify, in seconds), the
    draft's share of each decoding region's decode stage-time over the run (``regions``: the
    run's, by name), and what the draft takes (``draft``: the compiler's summary of it)."""
    sizes = bursts(gap_request, gap_cycles)
    counts = np.bincount(sizes, minlength=spec.draft_tokens + 2)[1:]
    total = step["draft_s"] + step["verify_s"]
    return {"draft": draft.get("model"), "draft_tokens": spec.draft_tokens,
            "acceptance": spec.acceptance, "acceptance_seed": spec.seed,
            "tokens_per_step_expected": spec.mean_tokens_per_step,
            "tokens_per_step": float(sizes.mean()) if len(sizes) else None,
            "tokens_per_step_share": {str(k + 1): float(c / max(len(sizes), 1))
                                      for k, c in enumerate(counts) if k < spec.draft_tokens
                                      + 1},
            "step_alone": {**step, "draft_share": step["draft_s"] / total if total else None},
            "draft_share_of_decode": {name: r["draft_share_of_decode"]
                                      for name, r in regions.items()
                                      if "draft_share_of_decode" in r},
            "draft_sram_bytes": draft.get("sram_bytes"),
            "draft_strip_columns": draft.get("strip_columns"),
            "draft_share_of_wafer_pes": draft.get("share_of_wafer_pes"),
            "kv_capacity_tokens": draft.get("target_kv_capacity_tokens")}
