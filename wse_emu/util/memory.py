"""Keeping freed memory in the process, for a run of jobs that each allocate and free alike.

A stage-table worker times shape after shape: each job builds a task graph and the engine's
state (up to a few hundred MB for a wafer-wide stage) and frees it all at the end. By default
glibc's allocator serves large blocks from fresh mappings (from 128 KB, a threshold it raises
to the largest block freed, up to 32 MB) and hands the top of its heap back to the system once
much of it is free, so each job faults much of its memory in again, page by page; on the
2-core machines this project is measured on, a first touch costs several times the work done
on the page (400 MB in 4 KB pages: 0.15 to 0.37 s to fault in, 0.05 to 0.09 s to fill again
once mapped). Fixed thresholds keep blocks of up to 32 MB in the heap and the heap's freed top
in the process, so the next job reuses pages already mapped. The process's peak is about the
same (the cold quick-grid frontier: 633 MiB, 620 before).

An experiment's serving runs are such jobs too (``goodput.serve_run``): without fixed
thresholds, whether a run's largest arrays (its gaps between tokens, a few MB) came from the
heap or from fresh mappings depended on the order of the allocations before them, so a change
anywhere on the Python side could make every run fault its pages in again (1,000-request runs
of the 8B frontier: 12% to 16% slower, seven times the system time, the same results).
"""

from __future__ import annotations

import ctypes
import sys

# mallopt's parameters (glibc's malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# The largest mapping threshold glibc accepts on a 64-bit system; larger blocks (rare: a
# whole-wafer stage's biggest arrays) are still mapped and unmapped each time.
MMAP_THRESHOLD_BYTES = 32 * 2**20
# Freed heap top kept up to this much (mallopt takes an int).
TRIM_THRESHOLD_BYTES = 2**31 - 1

_kept = False


def keep_freed_memory() -> bool:
    """Ask the C allocator (glibc's; elsewhere nothing is done) to keep freed memory for
    reuse, once per process. Returns whether it is now kept."""
    global _kept
    if _kept or not sys.platform.startswith("linux"):
        return _kept
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # no C library to ask, or one without mallopt
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    # mallopt returns 1 on success; musl's stub returns 0 and changes nothing.
    _kept = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))
    return _kept
