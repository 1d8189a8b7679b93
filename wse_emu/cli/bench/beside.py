"""What else the machine did while a benchmark case ran: a time measured with other work beside
it is not the figure measured alone, and every case says which it was.

The kernel's counters (``/proc/stat``, Linux) give the CPU time spent by every process on the
machine. The case's own, its process and every process it waited for (``RUSAGE_CHILDREN``:
the workers of an experiment count, as their parent waited for them), is taken off; what is
left, per second of the case's wall time, is how many cores other work kept busy. On a
virtual machine the time the host gave the machine's cores to something else (steal) is
counted apart: the case's cores were not running at all then. Without ``/proc/stat`` only the
load average is reported.
"""

from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass
from pathlib import Path

PROC_STAT = Path("/proc/stat")


@dataclass(frozen=True)
class Snapshot:
    """The counters at one moment (seconds): wall clock, CPU busy and stolen on the whole
    machine (None without ``/proc/stat``), this process's CPU and that of the processes it
    waited for, and the one-minute load average."""

    wall_s: float
    busy_s: float | None
    steal_s: float | None
    ours_s: float
    load_1min: float


def machine_cpu(stat_text: str, ticks_per_s: float) -> tuple[float, float]:
    """(busy, steal) seconds of the machine's CPUs from ``/proc/stat``'s first line: user,
    nice, system, irq and softirq are busy (a guest's time is already in user); idle and
    iowait are not."""
    fields = stat_text.splitlines()[0].split()
    if fields[0] != "cpu":
        raise ValueError("/proc/stat does not start with the cpu line")
    ticks = [int(v) for v in fields[1:]] + [0] * 8  # older kernels have fewer columns
    user, nice, system, _idle, _iowait, irq, softirq, steal = ticks[:8]
    return (user + nice + system + irq + softirq) / ticks_per_s, steal / ticks_per_s


def snapshot() -> Snapshot:
    """The counters now."""
    busy = steal = None
    try:
        busy, steal = machine_cpu(PROC_STAT.read_text(), os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError):
        pass  # not Linux, or a kernel that says it otherwise: the load average alone
    ours = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        ours += usage.ru_utime + usage.ru_stime
    return Snapshot(time.monotonic(), busy, steal, ours, os.getloadavg()[0])


def beside(before: Snapshot, after: Snapshot) -> dict:
    """What ran beside the case between two snapshots: the machine's cores; the cores other
    work kept busy on average and the cores the host took away (None without the counters);
    the load average before and after. The counters tick a hundred times a second, so a
    short case's averages are coarse."""
    wall = max(after.wall_s - before.wall_s, 1e-9)
    out = {"cores": os.cpu_count(), "other_work_cores": None, "host_steal_cores": None,
           "load_1min_before": round(before.load_1min, 2),
           "load_1min_after": round(after.load_1min, 2)}
    if before.busy_s is not None and after.busy_s is not None:
        others = (after.busy_s - before.busy_s) - (after.ours_s - before.ours_s)
        out["other_work_cores"] = round(max(others, 0.0) / wall, 2)
        out["host_steal_cores"] = round(max(after.steal_s - before.steal_s, 0.0) / wall, 2)
    return out
