"""Per-request and per-run serving metrics: TTFT, TPOT, latency percentiles, throughput,
goodput under latency targets."""

from __future__ import annotations

import numpy as np

from wse_emu.runtime.serve import ServeResult
from wse_emu.runtime.workload import Requests


def percentiles(values: np.ndarray) -> dict[str, float]:
    return {f"p{q}": float(np.percentile(values, q)) for q in (50, 90, 99)}


def run_metrics(res: ServeResult, reqs: Requests, ttft_slo_s: float | None,
                tpot_slo_s: float | None) -> dict:
    ttft, tpot = res.ttft_s(), res.tpot_s()
    e2e = (res.finish - res.arrival) / res.clock_hz
    span = (res.finish.max() - res.arrival.min()) / res.clock_hz
    ok = np.ones(len(ttft), dtype=bool)
    if ttft_slo_s is not None:
        ok &= ttft <= ttft_slo_s
    if tpot_slo_s is not None:
        ok &= tpot <= tpot_slo_s
    out = {
        "requests": len(ttft),
        "duration_s": float(span),
        "ttft_s": percentiles(ttft),
        "tpot_s": percentiles(tpot),
        "e2e_s": percentiles(e2e),
        "output_tokens_per_s": float(res.tokens.sum() / span) if span > 0 else 0.0,
        "requests_per_s": float(len(ttft) / span) if span > 0 else 0.0,
        "slo_attainment": float(ok.mean()),
        "goodput_requests_per_s": float(ok.sum() / span) if span > 0 else 0.0,
    }
    sessions = np.unique(reqs.session)
    if len(sessions) < len(reqs):
        ends = np.array([res.finish[reqs.session == s].max() - res.arrival[reqs.session == s]
                         .min() for s in sessions]) / res.clock_hz
        out["session_s"] = percentiles(ends)
    return out


def request_rows(res: ServeResult, reqs: Requests) -> list[list]:
    ttft, tpot = res.ttft_s(), res.tpot_s()
    return [[i, int(reqs.session[i]), int(reqs.call[i]), int(reqs.prompt_tokens[i]),
             int(res.tokens[i]), res.arrival[i] / res.clock_hz, ttft[i], tpot[i],
             (res.finish[i] - res.arrival[i]) / res.clock_hz, res.region[i]]
            for i in range(len(ttft))]


REQUEST_COLUMNS = ["request", "session", "call", "prompt_tokens", "output_tokens", "arrival_s",
                   "ttft_s", "tpot_s", "e2e_s", "decode_region"]
