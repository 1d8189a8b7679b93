"""What the tests share: the fixtures' paths; experiment arguments with every knob fixed at
one value, each layout at its own pipeline depth and no confirming runs, so that a search of a
tiny model takes seconds (the tests that tune a knob override it); the rate searches of a list
of configurations, run to their answers; and a made-up judged run."""

from pathlib import Path

from wse_emu.runtime.experiment import Point, Pressure, Search, run_searches
from wse_emu.runtime.metrics import Percentiles, RunMetrics, UserSpeeds

FIXTURES = Path(__file__).parent / "fixtures"
HF_CONFIGS = FIXTURES / "hf_configs"  # one model per folder, as a downloaded snapshot has it
SMALL_CHAT = FIXTURES / "small_chat.yaml"  # 40 chat requests

QUICK_KNOBS = ["--token-budget", "64", "--copies", "1", "--prefill-tile", "64", "--interleave", "1",
               "--max-running", "0", "--batch-limit", "64", "--window-s", "0",
               "--layers-per-stage", "own"]


def search_all(configs, run_points, tolerance: float = 0.05) -> list:
    """Every configuration's rate search; ``run_points(jobs)`` evaluates (index, factor)
    pairs."""
    searches = [Search(c) for c in configs]
    run_searches(dict(enumerate(searches)), run_points, tolerance=tolerance)
    return searches


def made_up_point(rate: float, met: bool, ttft_p90_s: float = 0.5, tpot_p90_s: float = 0.5,
                  **numbers) -> Point:
    """A judged run at ``rate`` with the metrics and pressure given by name (the others 0,
    a steady window that kept its pace)."""
    def times(p90):
        return Percentiles(p90, p90, p90)
    pressure = {name: numbers.pop(name, 0.0) for name in Pressure.__dataclass_fields__}
    metrics = dict(requests=100, duration_s=10.0, ttft_s=times(ttft_p90_s),
                   tpot_s=times(tpot_p90_s), e2e_s=times(1.0), itl_s=times(tpot_p90_s),
                   output_tokens_per_s=0.0, requests_per_s=rate, slo_attainment=1.0,
                   goodput_requests_per_s=0.0, user_tokens_per_s=UserSpeeds(1.0, 1.0, 1.0),
                   refused=0, window_requests=80, window_s=8.0, window_output_tokens_per_s=0.0,
                   ttft_by_fifth_s=[0.0] * 5, ttft_growth_s=0.0, ttft_slope=0.0, pace=1.0,
                   too_short=False)
    return Point(rate, met, RunMetrics(**{**metrics, **numbers}), Pressure(**pressure))
