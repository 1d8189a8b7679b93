"""A command run to its end, as a case: its wall time and the largest resident memory of any
process of its tree (each worker was waited for by its own parent, so it counts): a bound on
each process, not their sum. A process of its own, so that one run's peak is not another's."""

from __future__ import annotations

import resource
import subprocess
import time

from wse_emu.cli.bench.case import report


def measure(command: list[str]) -> dict:
    began = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True, check=False)
    return {"seconds": time.perf_counter() - began, "returncode": proc.returncode,
            "stderr": proc.stderr[-2000:], "stdout": proc.stdout,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}


if __name__ == "__main__":
    report(measure)
