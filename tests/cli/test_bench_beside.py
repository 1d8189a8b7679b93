"""Every benchmark case says what else the machine ran while it did (``bench.beside``): the
cores other work kept busy, with the case's own processes taken off, and the cores the host
took away."""

import subprocess
import sys

import pytest

from wse_emu.cli.bench import beside as bs
from wse_emu.cli.bench.case import child

STAT = """cpu  1000 20 300 5000 40 5 7 11 0 0
cpu0 500 10 150 2500 20 2 3 5 0 0
intr 12345
"""


def test_busy_is_user_nice_system_irq_softirq_and_steal_apart():
    busy, steal = bs.machine_cpu(STAT, 100)
    assert busy == pytest.approx((1000 + 20 + 300 + 5 + 7) / 100)
    assert steal == pytest.approx(11 / 100)


def test_a_kernel_with_fewer_columns_has_no_steal():
    busy, steal = bs.machine_cpu("cpu 100 0 50 900\n", 100)
    assert (busy, steal) == (1.5, 0.0)


def test_the_case_own_cpu_is_not_other_work():
    before = bs.Snapshot(wall_s=10.0, busy_s=100.0, steal_s=1.0, ours_s=5.0, load_1min=0.5)
    # Two seconds: the machine busy for 3 CPU-seconds, 1 of them the case's own; the host
    # took 0.2 s.
    after = bs.Snapshot(wall_s=12.0, busy_s=103.0, steal_s=1.2, ours_s=6.0, load_1min=1.25)
    out = bs.beside(before, after)
    assert out["other_work_cores"] == 1.0
    assert out["host_steal_cores"] == 0.1
    assert (out["load_1min_before"], out["load_1min_after"]) == (0.5, 1.25)


def test_without_the_kernel_counters_only_the_load_average():
    before = bs.Snapshot(0.0, None, None, 0.0, 0.1)
    out = bs.beside(before, bs.Snapshot(1.0, None, None, 0.5, 0.2))
    assert out["other_work_cores"] is None and out["host_steal_cores"] is None
    assert out["load_1min_after"] == 0.2


@pytest.mark.skipif(not bs.PROC_STAT.exists(), reason="needs the kernel's counters (Linux)")
def test_a_case_says_what_ran_beside_it_and_not_itself():
    def burn(seconds: float) -> list[str]:
        return [sys.executable, "-c",
                f"import time\nend = time.time() + {seconds}\nwhile time.time() < end: pass"]

    def sleeping() -> float:
        out = child("timed", [sys.executable, "-c", "import time; time.sleep(1.5)"])
        return out["beside"]["other_work_cores"]

    # Judged against what else the machine was doing meanwhile (another test run, say),
    # read by a case that only sleeps.
    background = sleeping()
    # The case itself keeps a core busy: its own work, not other work.
    busy = child("timed", burn(1.0))["beside"]
    assert busy["other_work_cores"] < background + 0.5
    assert busy["cores"] >= 1
    # The case sleeps while another process (not waited for until after) keeps a core busy.
    burner = subprocess.Popen(burn(3.0))
    try:
        loaded = sleeping()
    finally:
        burner.wait()
    assert loaded > background + 0.5
