"""A drawing case: every full-wafer map of a decode run's directory, the fastest of
``repeat`` drawings (the simulation that writes the directory is not what is measured)."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from wse_emu.cli.bench.case import peak_rss_mib, report


def measure(case: dict) -> dict:
    from wse_emu.cli.main import main
    from wse_emu.visualize.rundraw import draw_run

    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        main(["run", case["model"], "--fabric", case["fabric"], "--phase", "decode", "--batch",
              "1", "--context", "4096", "-o", str(run_dir)])
        times = []
        for _ in range(case["repeat"]):
            start = time.perf_counter()
            draw_run(run_dir, ("maps",))
            times.append(time.perf_counter() - start)
        maps = len(list((run_dir / "figures").glob("map_*.pixels.png")))
    return {"seconds": min(times), "seconds_all": times, "maps": maps,
            "peak_rss_mib": peak_rss_mib()}


if __name__ == "__main__":
    report(measure)
