"""How a benchmark case runs: in a fresh Python process of its own (``python -m
wse_emu.cli.bench.MODULE '{case as JSON}'``), so that its peak resident memory is its own; the
module measures the case and prints its figures as one JSON line, with that peak. What else
the machine ran meanwhile is added to them (``beside``)."""

from __future__ import annotations

import json
import resource
import subprocess
import sys

from wse_emu.cli.bench.beside import beside, snapshot


def peak_rss_mib() -> float:
    """This process's largest resident memory so far, MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(module: str, payload, env: dict | None = None) -> dict:
    """The figures ``wse_emu.cli.bench.<module>`` prints for ``payload``, run in a fresh
    process (with the environment ``env``, if given), and under ``beside`` what else the
    machine ran while it did."""
    before = snapshot()
    proc = subprocess.run([sys.executable, "-m", f"wse_emu.cli.bench.{module}",
                           json.dumps(payload)], capture_output=True, text=True, check=False,
                          env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"benchmark case {payload} failed:\n{proc.stderr}")
    figures = json.loads(proc.stdout.strip().splitlines()[-1])
    return {**figures, "beside": beside(before, snapshot())}


def report(measure) -> None:
    """A case module's main: ``measure(case)`` for the case given as JSON on the command
    line, printed as one JSON line."""
    print(json.dumps(measure(json.loads(sys.argv[1]))))
