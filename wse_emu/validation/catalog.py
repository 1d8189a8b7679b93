"""Every check, in the order the table shows them, and running a choice of them."""

from __future__ import annotations

from wse_emu.errors import UserError
from wse_emu.validation import gpu_planner, logits, noc, trn2, vendor, waferllm
from wse_emu.validation.checks import FAST, Check, Outcome, run_check

CHECKS: list[Check] = [*waferllm.CHECKS, *vendor.CHECKS, *trn2.CHECKS, *gpu_planner.CHECKS,
                       *noc.CHECKS, *logits.CHECKS]


def chosen(fast_only: bool = False, only: str | None = None) -> list[Check]:
    """The checks asked for: all, the fast ones, or those whose name holds ``only``
    (case-insensitive); none matching is refused by name."""
    picked = [c for c in CHECKS if (not fast_only or c.speed == FAST)
              and (only is None or only.lower() in c.name.lower())]
    if not picked:
        names = "; ".join(c.name for c in CHECKS)
        raise UserError(f"no check matches {only!r}" + (" among the fast ones" if fast_only
                                                        else "") + f": the checks are {names}")
    return picked


def validate(fast_only: bool = False, only: str | None = None, progress=None) -> list[Outcome]:
    """Run the checks asked for (``chosen``), one after another."""
    out = []
    checks = chosen(fast_only, only)
    for n, check in enumerate(checks, 1):
        if progress:
            progress(f"check {n} of {len(checks)}: {check.name}")
        out.append(run_check(check))
    return out
