"""The analytic ceiling of a serving configuration: the request rate at which its busiest
stage would be busy all the time, from its stage-time tables and the workload's mean lengths.

No schedule serves faster, so a configuration's measured highest rate divided by its ceiling
says how much of its hardware the latency targets let it use. Per request, a stage does the
prompt's prefill (tile by tile, each tile after the ones before it) and, for each later output
token, its share of a decode micro-batch: as many sequences as the region's KV cache holds
(whole sequences), spread over as many micro-batches as it has stages (as serving does), at
most the batch limit each, at the mean context halfway through the output. A colocated region
does both on the same stages; a disaggregated split's prefill regions (and the KV handoff over
their link) and its decode regions are separate resources, and the scarcer one sets the
ceiling. Rates are per session for multi-call workloads, like the search's.
"""

from __future__ import annotations

import numpy as np

from wse_emu.runtime.serve import RegionModel, ServeOptions
from wse_emu.runtime.workload import Requests


def prefill_cycles(region: RegionModel, prompt: float, tile: int) -> np.ndarray:
    """Per stage: the cycles of one prompt of ``prompt`` tokens, tile after tile."""
    table = region.prefill
    total = np.zeros(len(table.stage_cycles(1, 0)))
    done = 0.0
    while done < prompt:
        size = min(tile, prompt - done)
        total += table.stage_cycles(size, done)
        done += size
    return total


def decode_cycles(region: RegionModel, prompt: float, output: float,
                  batch_limit: int) -> np.ndarray:
    """Per stage: the cycles of one request's decode tokens, at the batch a full KV cache
    allows."""
    table = region.decode
    stages = len(table.stage_cycles(1, 1))
    concurrent = region.kv_capacity_tokens / max(prompt + output, 1.0)
    batch = float(np.clip(concurrent / stages, 1.0, batch_limit))
    per_token = table.stage_cycles(batch, prompt + output / 2) / batch
    return per_token * max(output - 1.0, 0.0)


def ceiling_rate(regions: list[RegionModel], options: ServeOptions,
                 requests: Requests) -> float:
    """Requests (sessions) per second at which the configuration's busiest resource would be
    busy all the time."""
    prompt = float(np.mean(requests.prompt_tokens))
    output = float(np.mean(requests.output_tokens))
    calls = len(requests) / len(np.unique(requests.session))
    clock = options.clock_hz
    mixed = prefill_rate = decode_rate = 0.0
    for r in regions:
        if r.role == "mixed":
            work = prefill_cycles(r, prompt, options.prefill_tile) + decode_cycles(
                r, prompt, output, options.batch_limit)
            mixed += clock / float(work.max())
        elif r.role == "prefill":
            rate = clock / float(prefill_cycles(r, prompt, options.prefill_tile).max())
            if options.kv_bytes_per_token and options.handoff_bytes_per_cycle > 0:
                handoff = prompt * options.kv_bytes_per_token / options.handoff_bytes_per_cycle
                rate = min(rate, clock / handoff)
            prefill_rate += rate
        else:
            decode_rate += clock / float(decode_cycles(r, prompt, output,
                                                       options.batch_limit).max())
    per_call = mixed if mixed else min(prefill_rate, decode_rate)
    return per_call / calls
