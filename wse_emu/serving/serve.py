"""Serving requests on pools, event by event (the execution model of the design notes).

A pool (``pools.py``; a compiled wafer region is one) is a pipeline of stages. A micro-batch (a
tile of a prompt, one new token for each of several sequences, or, chunked, both) enters stage
0 when it is free, holds each stage for that stage's time (from the pool's stage tables) and
moves on; micro-batches never overtake each other. A sequence's next token can enter only
after its previous one left the last stage. Which micro-batch a pool sends next is its
policy's choice (``policies.py``): colocated pools serve with the policy the options name, a
disaggregated split's pools first come first served.

Disaggregated, a finished prompt's KV cache moves to a decode pool with room for it. A handoff
inside a system crosses its fabric between the pools; between systems it leaves over the
sending system's link and arrives over the receiving system's, holding both (the links are
full duplex, so a system sends and receives at once); each link carries one sequence's KV
after another. A pool admits a sequence only when its KV fits (the whole sequence's in a
colocated or decode pool, the prompt's in a prefill pool) and, with a cap on running
sequences, when fewer than the cap hold KV there.

Agentic sessions send each call the whole context so far. With the prefix cache, a pool keeps
a finished call's KV (a colocated pool the call's prompt and output, a prefill pool the prompt
it handed off) until it needs the room, least recently used first; the session's next call
goes to that pool and computes only the tokens after the cached prefix. Decode pools keep
nothing: the next call's prefill runs elsewhere.

Each pool also counts its decode stall: the time its tokens spent beyond their own decode work
(waiting for stage 0, behind other micro-batches, or carrying a prefill chunk). It is what
colocation costs decode, and what disaggregation is meant to remove.

Two loops serve: the compiled one (``compiled_loop.py``, the default) and its plain-Python
twin (``plain_loop.py``); on the same inputs they give the same times.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np
from numba import njit

from wse_emu.errors import UserError
from wse_emu.serving.caps import CapUse
from wse_emu.serving.knobs import ServingKnobs
from wse_emu.serving.loops.plain import serve_plain
from wse_emu.serving.loops.state import serve_compiled
from wse_emu.serving.policies import POLICIES, ROUTERS, SPLIT_POLICY
from wse_emu.serving.speculation import Speculation, speculating
from wse_emu.serving.workload import Requests
from wse_emu.util.checks import flag, is_number, one_of, positive, short_repr, whole

LOOPS = ("compiled", "plain")
# Where KV the prefix cache gives up goes: nowhere (it is computed again when next needed), or
# host memory over the system's off-wafer link, brought back when that is quicker.
KV_TIERS = ("none", "host")
# Host memory for parked KV, per region: an assumption (no figure is published for a CS-3's
# host servers), a round 512 GB, stated wherever the tier is reported.
HOST_KV_BYTES = 512e9


@dataclass(frozen=True, kw_only=True)
class _ServeSettings:
    """What ``ServeOptions`` holds besides the knobs. The hardware's numbers have no defaults:
    ``ServeOptions.of`` takes them from the fabric and the model."""

    clock_hz: float
    kv_bytes_per_token: int  # KV cache bytes per token (all layers)
    policy: str = "prefill-priority"  # colocated pools
    # reuse KV still resident: a session's from its previous call, a block trace's blocks
    prefix_cache: bool = True
    router: str = ROUTERS[0]  # which region an arriving request joins (``ROUTERS``)
    # The tier off the wafer (``KV_TIERS``), its bytes per region, and the fixed cost of one
    # transfer from it (the fabric's host transaction overhead, given by ``of``).
    kv_tier: str = KV_TIERS[0]
    host_kv_bytes: float = HOST_KV_BYTES
    host_transfer_overhead_s: float = 0.0
    timeline_events: int = 0  # stage events kept per pool for the timeline (0: none)
    # Speculative decoding: tokens drafted per verify step (0: none), the probability that
    # each is accepted (or an acceptance table's path: ``speculation``; read only with drafted
    # tokens, so that a search over them may hold it throughout), and the seed of the
    # acceptances drawn. The pools that decode must be built to verify as many.
    draft_tokens: int = 0
    acceptance: float | str | Path | None = None
    acceptance_seed: int = 0


# The knobs are the first base so that their fields come after the settings' (a dataclass
# lists its bases' fields from the last base to the first): options are listed, and checked,
# hardware first.
@dataclass(frozen=True, kw_only=True)
class ServeOptions(ServingKnobs, _ServeSettings):
    """How requests are served: the hardware's clock and KV bytes per token, the colocated
    policy, the prefix cache, the timeline, and every serving knob (``ServingKnobs``)."""

    def __post_init__(self):
        positive("clock_hz", self.clock_hz)
        whole("kv_bytes_per_token", self.kv_bytes_per_token, 0)
        whole("timeline_events", self.timeline_events, 0)
        one_of("policy", self.policy, POLICIES)
        flag("prefix_cache", self.prefix_cache)
        one_of("router", self.router, ROUTERS)
        one_of("kv_tier", self.kv_tier, KV_TIERS)
        positive("host_kv_bytes", self.host_kv_bytes)
        # What would be ignored is refused: the tier keeps what the prefix cache gives up.
        if self.kv_tier == "host" and not self.prefix_cache:
            raise UserError("`kv_tier=host` keeps what the prefix cache gives up: it needs "
                            "the prefix cache (drop `prefix_cache=False`)")
        if self.kv_tier == "none" and self.host_kv_bytes != HOST_KV_BYTES:
            raise UserError("`host_kv_bytes` sizes the host KV tier: give `kv_tier=host` "
                            "with it")
        if not is_number(self.host_transfer_overhead_s) or self.host_transfer_overhead_s < 0:
            raise UserError("`host_transfer_overhead_s` must be a number >= 0, got "
                            f"{short_repr(self.host_transfer_overhead_s)}")
        whole("draft_tokens", self.draft_tokens, 0)
        whole("acceptance_seed", self.acceptance_seed, 0)
        if self.draft_tokens > 0 and self.acceptance is None:
            raise UserError("speculative decoding takes `draft_tokens` and `acceptance` "
                            "together: the acceptance is an input, never assumed")
        self.speculation()  # checked by name now, not when serving begins
        super().__post_init__()

    def speculation(self) -> Speculation | None:
        """Speculative decoding as these options ask for it, or None."""
        if not self.draft_tokens:
            return None
        return Speculation.of(self.draft_tokens, self.acceptance, self.acceptance_seed)

    @classmethod
    def of(cls, fabric, model, **settings) -> "ServeOptions":
        """Options for ``model`` (a ModelSpec) on ``fabric`` (a FabricSpec): its clock and
        the model's KV bytes per token; ``settings`` are the other fields, by name."""
        unknown = sorted(set(settings) - set(setting_names()))
        if unknown:
            raise UserError(f"unknown serving option `{unknown[0]}`: the options are "
                            f"{', '.join(setting_names())}")
        overhead = getattr(fabric, "host_transfer_overhead_s", 0.0)
        return cls(clock_hz=fabric.clock_hz, kv_bytes_per_token=model.kv_bytes_per_token(),
                   **{"host_transfer_overhead_s": overhead, **settings})

    def host_tokens(self) -> int:
        """KV tokens the host tier holds per region."""
        return int(self.host_kv_bytes // max(self.kv_bytes_per_token, 1))

    def policies(self) -> dict:
        """Each role's policy with its knobs."""
        split = SPLIT_POLICY.of(self)
        return {"mixed": POLICIES[self.policy].of(self), "prefill": split, "decode": split}


def setting_names() -> tuple[str, ...]:
    """What ``ServeOptions.of`` (and the API's ``serve``) takes besides the hardware's."""
    return tuple(f.name for f in dataclasses.fields(ServeOptions)
                 if f.name not in ("clock_hz", "kv_bytes_per_token", "host_transfer_overhead_s"))


@dataclass
class ServeResult:
    arrival: np.ndarray  # cycles
    first_token: np.ndarray
    finish: np.ndarray
    tokens: np.ndarray
    region: list
    clock_hz: float
    regions: dict = field(default_factory=dict)  # name -> utilization and KV occupancy
    timeline: dict = field(default_factory=dict)  # Chrome trace (when asked for)
    kv_traces: dict = field(default_factory=dict)  # pool -> rows of (cycle, KV tokens held)
    # Every token after a request's first: its request and the cycles since the token before.
    gap_request: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int32))
    gap_cycles: np.ndarray = field(default_factory=lambda: np.zeros(0))
    requests: Requests | None = None  # what was served
    # Requests no pool could ever hold (``serve(..., refuse=True)``): never served, their
    # times infinite, so that they count against every target.
    refused: np.ndarray | None = None
    workload: str = ""  # its name
    loop_s: float = 0.0  # wall seconds of the event loop itself (not part of the results)
    # Per request: prompt tokens its region had cached, and of those, brought back from the
    # host tier (zeros where nothing was cached); and the KV tokens its admission parked in
    # the host tier.
    from_cache: np.ndarray | None = None
    from_host: np.ndarray | None = None
    to_host: np.ndarray | None = None
    # What its running cap and batch limit decided (``caps``), which says what other caps
    # would have served it the same way.
    caps: CapUse = field(default_factory=CapUse)

    def __post_init__(self):
        n = len(self.finish)
        for name in ("from_cache", "from_host", "to_host"):
            if getattr(self, name) is None:
                setattr(self, name, np.zeros(n, dtype=np.int64))

    def ttft_s(self) -> np.ndarray:
        return self._refusing((self.first_token - self.arrival) / self.clock_hz)

    def tpot_s(self) -> np.ndarray:
        gen = np.maximum(self.tokens - 1, 1)
        return self._refusing((self.finish - self.first_token) / gen / self.clock_hz)

    def served(self) -> np.ndarray:
        """The requests that were served (all but the refused)."""
        return np.ones(len(self.finish), dtype=bool) if self.refused is None else ~self.refused

    def _refusing(self, seconds: np.ndarray) -> np.ndarray:
        if self.refused is not None and self.refused.any():
            seconds = np.where(self.refused, np.inf, seconds)
        return seconds

    def itl_s(self, requests: np.ndarray | None = None) -> np.ndarray:
        """Inter-token latencies (every gap between a request's consecutive tokens), of the
        requests where the boolean mask ``requests`` is set (all by default)."""
        if requests is None:
            return self.gap_cycles / self.clock_hz
        return _gaps_of(self.gap_request, self.gap_cycles, requests, self.clock_hz)

    def __repr__(self) -> str:
        done = int(np.isfinite(self.finish).sum())
        return (f"ServeResult({len(self.finish)} requests, {done} finished, "
                f"{int(self.tokens.sum()):,} output tokens, pools {', '.join(self.regions)})")


@njit(cache=True)
def _gaps_of(owner, cycles, requests, clock_hz):
    """The gaps of the requests ``requests`` marks, in seconds, in the order they came: the
    values numpy's mask and division give, in one pass over the gaps (with a count before)."""
    n = 0
    for i in range(len(owner)):
        if requests[owner[i]]:
            n += 1
    out = np.empty(n, dtype=np.float64)
    n = 0
    for i in range(len(owner)):
        if requests[owner[i]]:
            out[n] = cycles[i] / clock_hz
            n += 1
    return out


def check_micro_batches(pools: list, policies: dict) -> None:
    """Every micro-batch size a pool's policy (``policies``: role -> policy) sends there must
    lie within the pool's stage tables (``Policy.limits``)."""
    for p in pools:
        for name, value, top in policies[p.role].limits(p):
            if value > top:
                raise UserError(f"`{name}` must be between 1 and {top} (the range of pool "
                                f"{p.name}'s stage tables), got {value}")


def kv_shortfall(requests: Requests, regions: list) -> str | None:
    """Why some request could never be served on ``regions`` (anything with a ``role`` and
    ``kv_capacity_tokens``) for lack of KV room, or None."""
    total = int((requests.prompt_tokens + requests.output_tokens).max())
    prompt = int(requests.prompt_tokens.max())
    for role, longest, what, where in (("mixed", total, "a request", "any region"),
                                       ("prefill", prompt, "a prompt", "any prefill region"),
                                       ("decode", total, "a request", "any decode region")):
        room = [r.kv_capacity_tokens for r in regions if r.role == role]
        if room and longest > max(room):
            return (f"{what} needs {longest:,} tokens of KV cache, more than {where} holds "
                    f"({max(room):,})")
    return None


def holdable(requests: Requests, regions: list) -> np.ndarray:
    """Per request, whether a region of every role it needs could ever hold its KV (as
    ``kv_shortfall`` asks of the longest); a session only if all its calls can, since its later
    calls follow the earlier ones."""
    total = requests.prompt_tokens + requests.output_tokens
    ok = np.ones(len(requests), dtype=bool)
    for role, need in (("mixed", total), ("prefill", requests.prompt_tokens),
                       ("decode", total)):
        room = [r.kv_capacity_tokens for r in regions if r.role == role]
        if room:
            ok &= need <= max(room)
    return ~np.isin(requests.session, requests.session[~ok])


def position_shortfall(requests: Requests, model) -> str | None:
    """Why some request runs past ``model``'s positions, or None. A request's last decode
    step feeds its second-to-last output token, so it needs prompt + output - 1 positions
    (as ``generate`` counts them)."""
    needs = requests.prompt_tokens + requests.output_tokens - 1
    over = np.flatnonzero(needs > model.max_position_embeddings)
    if not len(over):
        return None
    i = int(over[np.argmax(needs[over])])
    return (f"{len(over):,} of {len(requests):,} requests run past {model.name}'s "
            f"{model.max_position_embeddings:,} positions (max_position_embeddings); the "
            f"longest, {int(requests.prompt_tokens[i]):,} prompt and "
            f"{int(requests.output_tokens[i]):,} output tokens, needs {int(needs[i]):,}")


def serve(requests: Requests, pools: list, options, loop: str = "compiled",
          refuse: bool = False) -> ServeResult:
    """Serve ``requests`` on ``pools`` with ``options`` (a ServeOptions), on the compiled loop
    or its plain twin (``loop="plain"``). A request no pool could ever hold is an error, or,
    with ``refuse``, refused: never served, with its session (``ServeResult.refused``)."""
    if not isinstance(options, ServeOptions):
        raise UserError(f"`options` must be a ServeOptions, got {short_repr(options)}")
    one_of("loop", loop, LOOPS)
    if not pools:
        raise UserError("no regions to serve on")
    roles = {p.role for p in pools}
    if not roles & {"mixed", "prefill"} or not roles & {"mixed", "decode"}:
        raise UserError("serving needs regions for both prefill and decode")
    policies = options.policies()
    check_micro_batches(pools, policies)
    check_speculation(pools, options)
    check_tier(pools, options)
    short = kv_shortfall(requests, pools)
    if short and not refuse:
        raise UserError(short)
    if short:
        return _refusing(requests, pools, options, loop)
    # A prefix cache where something can be reused: a session's later calls, or the blocks a
    # block trace's requests share.
    caching = bool(options.prefix_cache) and (
        requests.blocks is not None or len(np.unique(requests.session)) < len(requests))
    run = serve_plain if loop == "plain" else serve_compiled
    return _result(requests, pools, options,
                   LoopOutput(*run(requests, pools, options, policies, caching)))


def check_tier(pools: list, options) -> None:
    """A host KV tier is brought back over each pool's link off its system: a pool whose link
    is not modelled (accelerators and GPUs timed alone) cannot have one."""
    if options.kv_tier == "none":
        return
    for p in pools:
        if p.role != "decode" and not np.isfinite(p.link_bytes_per_cycle):
            raise UserError(f"pool {p.name} has no off-system link modelled, so a KV tier in "
                            f"host memory cannot be reached from it: use `kv_tier=none`")


def check_speculation(pools: list, options) -> None:
    """Every pool that decodes verifies as many drafted tokens as the options ask (none,
    without speculation): a verify step is timed for its number of tokens, never scaled."""
    asked = options.draft_tokens
    for p in pools:
        if p.decode is None:
            continue
        _, drafts = speculating(p)
        if drafts != asked:
            what = f"verifies {drafts} drafted tokens" if drafts else "has no draft"
            raise UserError(f"pool {p.name} {what}; serving asks for "
                            f"`draft_tokens={asked}`")


def _refusing(requests: Requests, pools: list, options, loop: str) -> ServeResult:
    """``serve`` of the requests some pool can hold, with the others refused: arriving with
    their session's first call, answered never (their times infinite, no tokens)."""
    keep = holdable(requests, pools)
    start = requests.arrival_s[requests.call == 0]
    first_of = dict(zip(requests.session[requests.call == 0].tolist(), start.tolist()))
    arrival = np.array([first_of[s] for s in requests.session.tolist()]) * options.clock_hz
    n = len(requests)
    out = ServeResult(arrival.copy(), arrival.copy(), arrival.copy(), np.zeros(n, dtype=np.int64),
                      [""] * n, options.clock_hz, requests=requests, refused=~keep)
    if not keep.any():
        return out
    inner = serve(_subset(requests, keep), pools, options, loop)
    index = np.flatnonzero(keep)
    for name in ("arrival", "first_token", "finish"):
        getattr(out, name)[index] = getattr(inner, name)
    out.tokens[index] = inner.tokens
    out.from_cache[index], out.from_host[index] = inner.from_cache, inner.from_host
    out.to_host[index] = inner.to_host
    for k, i in enumerate(index):
        out.region[i] = inner.region[k]
    out.regions, out.kv_traces, out.timeline = inner.regions, inner.kv_traces, inner.timeline
    out.gap_request, out.gap_cycles = index[inner.gap_request], inner.gap_cycles
    out.loop_s, out.caps = inner.loop_s, inner.caps
    return out


def _subset(requests: Requests, keep: np.ndarray) -> Requests:
    return requests.subset(keep)


class LoopOutput(NamedTuple):
    """What either loop leaves (``plain_loop.serve_plain``, ``compiled_state.serve_compiled``):
    per request its times (cycles) and tokens and the pool it decoded on, every gap between
    tokens, and per pool its counters, KV trace and timeline events."""

    arrival: np.ndarray
    first: np.ndarray
    finish: np.ndarray
    made: np.ndarray
    where: list
    from_cache: np.ndarray  # prompt tokens its region had cached
    from_host: np.ndarray  # of those, brought back from the host tier
    to_host: np.ndarray  # KV tokens its admission parked in the host tier
    gap_request: np.ndarray
    gap_cycles: np.ndarray
    stats: list  # per pool: busy_prefill, busy_decode, decoded, stall, work, kv_blocked,
    # reused, kv_used, trace (rows of cycle, KV tokens), events [(stage, start, end, label)],
    # and what its caps decided (``caps.CAP_COUNTERS``)
    loop_s: float  # wall seconds of the event loop itself


def _result(requests: Requests, pools: list, options, out: LoopOutput) -> ServeResult:
    (arrival, first, finish, made, where, from_cache, from_host, to_host, gap_request,
     gap_cycles, stats, loop_s) = out
    if np.isnan(finish).any():
        raise AssertionError("a request never finished")
    for p, s in zip(pools, stats):
        if s["kv_used"] != 0:
            raise AssertionError(f"region {p.name} kept {s['kv_used']} tokens of KV")
    clock = options.clock_hz
    start, end = float(np.nanmin(arrival)), float(np.nanmax(finish))
    span = (end - start) or 1.0
    regions = {}
    for p, s in zip(pools, stats):
        cycles = p.stages * span
        trace = s["trace"]
        regions[p.name] = {
            "role": p.role,
            "stage_utilization": (s["busy_prefill"] + s["busy_decode"]) / cycles,
            "prefill_utilization": s["busy_prefill"] / cycles,
            "decode_utilization": s["busy_decode"] / cycles,
            **({"draft_share_of_decode": s["busy_draft"] / s["busy_decode"]}
               if s["busy_draft"] and s["busy_decode"] else {}),
            "decode_tokens": s["decoded"], "decode_stall_s": s["stall"] / clock,
            "decode_work_s": s["work"] / clock, "kv_blocked_s": s["kv_blocked"] / clock,
            "prefix_reused_tokens": s["reused"],
            **({"prefix_restored_tokens": s["restored"], "host_parked_tokens": s["parked"]}
               if options.kv_tier != "none" else {}),
            "kv_capacity_tokens": p.kv_capacity_tokens,
            "kv_peak_tokens": int(trace[:, 1].max()) if len(trace) else 0,
            "kv_mean_tokens": _mean_kv(trace, start, end)}
    timeline = _chrome_trace(pools, stats, clock) if options.timeline_events else {}
    return ServeResult(arrival, first, finish, made, where, clock, regions, timeline,
                       {p.name: s["trace"] for p, s in zip(pools, stats)},
                       gap_request, gap_cycles, requests, loop_s=loop_s,
                       from_cache=from_cache, from_host=from_host, to_host=to_host,
                       caps=CapUse.of(stats))


def _mean_kv(trace: np.ndarray, start: float, end: float) -> float:
    """Time-weighted KV tokens held between ``start`` and ``end``."""
    if not len(trace):
        return 0.0
    # Not np.dot: BLAS splits a long dot product among its threads, so its last digits
    # changed with the number of cores (and its threads then spun on cores the other
    # workers of a pool needed). numpy's own sum is one order of additions everywhere.
    held = float((trace[:, 1] * np.diff(trace[:, 0], append=end)).sum())
    return held / max(end - start, 1.0)


def _chrome_trace(pools: list, stats: list, clock: float) -> dict:
    """One process per pool, one track per stage, an event per micro-batch (microseconds)."""
    us = 1e6 / clock
    events = []
    for pid, (p, s) in enumerate(zip(pools, stats)):
        events.append({"name": "process_name", "ph": "M", "pid": pid,
                       "args": {"name": f"{p.name} ({p.role})"}})
        events += [{"name": "thread_name", "ph": "M", "pid": pid, "tid": k,
                    "args": {"name": f"stage {k}"}} for k in range(p.stages)]
        for stage, begin, end, label in s["events"]:
            events.append({"name": label, "ph": "X", "pid": pid, "tid": stage,
                           "ts": begin * us, "dur": (end - begin) * us})
    return {"traceEvents": events, "displayTimeUnit": "ms"}
