"""What a serving run's caps decided, and which other caps would have served it the same way.

Two knobs enter the serving loops only as caps. ``max_running``: a region admits a request, or
takes a handoff, only while fewer sequences than the cap hold KV there (0: no cap).
``batch_limit``: a decode micro-batch takes at most so many of the sequences it asks for.
Each loop notes, per region, what those checks found (``CAP_COUNTERS``): the most sequences a
running-cap check found holding KV and the checks that found the cap reached; the most
sequences a decode micro-batch asked for (of those ready) and the micro-batches the limit cut.

From that follows exactly which other caps would have served the same requests the same way
(``CapUse.same_under``). A cap that never stopped anything would stop nothing at any value
above what its checks found, so every decision of the run, and with them every time, would be
the same; a cap that did stop something is the same only at its own value. An experiment that
tunes these knobs tries several of their values at one rate, and most often neither binds:
its serving runs (``experiments.goodput.RunBook``) serve the loosest first and let its run
stand for every other it proves alike.
"""

from __future__ import annotations

from dataclasses import dataclass

# The loops' counters, per region, by the names ``CapUse`` gives their sums.
CAP_COUNTERS = ("running_peak", "running_met", "batch_peak", "batch_met")


@dataclass(frozen=True)
class CapUse:
    """Over a run's regions: the most sequences a running-cap check found holding KV, and how
    many checks found the cap reached; the most sequences a decode micro-batch asked for, and
    how many micro-batches the batch limit cut."""

    running_peak: int = 0
    running_met: int = 0
    batch_peak: int = 0
    batch_met: int = 0

    @classmethod
    def of(cls, stats: list) -> "CapUse":
        """From the loop's per-region counters (``serve.LoopOutput.stats``). Every region of
        a run serves with the same caps, so the largest peak and the sum of stops over them
        decide for all."""
        return cls(*(max((s[name] for s in stats), default=0) if name.endswith("peak")
                     else sum(s[name] for s in stats) for name in CAP_COUNTERS))

    def same_under(self, ran: tuple[int, int], other: tuple[int, int]) -> bool:
        """Whether the run, served with caps ``ran`` (``max_running``, ``batch_limit``), would
        have gone exactly the same with caps ``other``."""
        (running, limit), (running_2, limit_2) = ran, other
        return (running_2 == running or not self.running_met
                and (running_2 == 0 or running_2 > self.running_peak)) \
            and (limit_2 == limit or not self.batch_met and limit_2 >= self.batch_peak)
