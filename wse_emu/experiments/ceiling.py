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
ceiling. Rates are per session for multi-call workloads, like the search's; with the prefix
cache, every later call is taken to find its previous call's KV still cached (a colocated region
reuses the previous prompt and output, a prefill region the previous prompt), so the ceiling
stays an estimate from above. A handoff between wafers goes at the off-wafer rate.
"""

from __future__ import annotations

import numpy as np

from wse_emu.serving.serve import ServeOptions
from wse_emu.serving.speculation import speculating
from wse_emu.serving.workload import Requests


def prefill_cycles(region, prompt: float, tile: int,
                   cached: float = 0.0) -> np.ndarray:
    """Per stage: the cycles of one prompt of ``prompt`` tokens, tile after tile, after the
    first ``cached`` tokens (whose KV is reused)."""
    table = region.prefill
    total = np.zeros(len(table.stage_cycles(1, 0)))
    done = min(cached, prompt - 1.0) if cached else 0.0
    while done < prompt:
        size = min(tile, prompt - done)
        total += table.stage_cycles(size, done)
        done += size
    return total


def decode_cycles(region, prompt: float, output: float, batch_limit: int,
                  max_running: int = 0, tokens_per_step: float = 1.0) -> np.ndarray:
    """Per stage: the cycles of one request's decode tokens, at the batch a full KV cache
    (or the cap on running sequences) allows; speculating, a verify step's (its first tile,
    the draft's steps in the draft's stages, and its later tiles) over the ``tokens_per_step``
    it yields on average."""
    table = region.decode
    stages = len(table.stage_cycles(1, 1))
    concurrent = region.kv_capacity_tokens / max(prompt + output, 1.0)
    if max_running:
        concurrent = min(concurrent, max_running)
    batch = float(np.clip(concurrent / stages, 1.0, batch_limit))
    context = prompt + output / 2
    step = table.stage_cycles(batch, context)
    verify, drafts = speculating(region)
    if drafts:
        step = step + drafts * verify.stage_cycles(batch, context)
    per_token = step / (batch * tokens_per_step)
    return per_token * max(output - 1.0, 0.0)


def ceiling_rate(regions: list, options: ServeOptions,
                 requests: Requests) -> float:
    """Requests (sessions) per second at which the configuration's busiest resource would be
    busy all the time."""
    prompt = float(np.mean(requests.prompt_tokens))
    output = float(np.mean(requests.output_tokens))
    calls = len(requests) / len(np.unique(requests.session))
    clock = options.clock_hz
    tile = options.prefill_tile
    spec = options.speculation()
    yields = spec.mean_tokens_per_step if spec is not None else 1.0
    mixed = prefill_rate = decode_rate = 0.0
    decode_systems = {r.system for r in regions if r.role == "decode"}
    for r in regions:
        if r.role == "mixed":
            work = prefill_cycles(r, prompt, tile, _cached(requests, options, True)) \
                + decode_cycles(r, prompt, output, options.batch_limit, options.max_running,
                                yields)
            mixed += clock / float(work.max())
        elif r.role == "prefill":
            rate = clock / float(prefill_cycles(r, prompt, tile,
                                                _cached(requests, options, False)).max())
            link = r.fabric_bytes_per_cycle
            if decode_systems - {r.system}:
                link = r.link_bytes_per_cycle
            if options.kv_bytes_per_token and link > 0:
                rate = min(rate, clock / (prompt * options.kv_bytes_per_token / link))
            prefill_rate += rate
        else:
            decode_rate += clock / float(decode_cycles(r, prompt, output, options.batch_limit,
                                                       options.max_running, yields).max())
    per_call = mixed if mixed else min(prefill_rate, decode_rate)
    return per_call / calls


def _cached(requests: Requests, options: ServeOptions, with_output: bool) -> float:
    """Mean prompt tokens per call whose KV the prefix cache holds from the session's previous
    call (its prompt, and its output but the last token ``with_output``), if every later call
    finds it."""
    if not options.prefix_cache:
        return 0.0
    later = np.flatnonzero(requests.call > 0)
    if not len(later):
        return 0.0
    index = {(s, c): i for i, (s, c) in enumerate(zip(requests.session.tolist(),
                                                        requests.call.tolist()))}
    before = np.array([index[(int(requests.session[i]), int(requests.call[i]) - 1)]
                       for i in later])
    prefix = requests.prompt_tokens[before].astype(float)
    if with_output:
        prefix = prefix + requests.output_tokens[before] - 1
    return float(prefix.sum() / len(requests))
