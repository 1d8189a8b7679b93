"""The serving knobs' flags, made from their declarations (``wse_emu.serving.knobs``): one
flag per knob, named as its parameter (``prefill_tile`` -> ``--prefill-tile``), with its
declared default and help. ``serve`` takes one value each; the experiments take the values to
try, comma-separated (``spec_args``), defaulting to the values each kind of hardware's engines
use. The values are checked where they are used (``ServeOptions``, ``Space``); here they are
only read."""

from __future__ import annotations

import argparse

from wse_emu.pools.kinds.base import SERVER_KNOBS
from wse_emu.serving.knobs import info, knob_fields
from wse_emu.serving.policies import POLICIES, ROUTERS
from wse_emu.serving.serve import KV_TIERS, ServeOptions


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_serving_args(p) -> None:
    """One value per knob, the colocated policy, and the prefix cache."""
    default = ServeOptions(clock_hz=1.0, kv_bytes_per_token=0)
    p.add_argument("--policy", default=default.policy, metavar="|".join(POLICIES),
                   help=f"colocated batching policy (default {default.policy})")
    for f in knob_fields():
        p.add_argument(flag(f.name), type=int, default=f.default,
                       help=f"{info(f).help} (default {f.default})")
    p.add_argument("--no-prefix-cache", dest="prefix_cache", action="store_false",
                   help="recompute every prompt whole (by default an agentic call reuses its "
                        "session's KV, and a block trace's request the blocks of its prompt, "
                        "while they are still cached)")
    p.add_argument("--router", default=default.router, choices=ROUTERS,
                   help="which region an arriving request joins: the least busy (after the "
                        "one caching its session's previous call), the next in turn, or the "
                        "one caching the longest prefix of its blocks (default "
                        f"{default.router})")
    p.add_argument("--kv-tier", default=default.kv_tier, choices=KV_TIERS,
                   help="where KV the prefix cache gives up goes: nowhere (computed again when "
                        "needed) or host memory over the system's off-wafer link, brought back "
                        f"when that is quicker (default {default.kv_tier})")
    p.add_argument("--host-kv-bytes", type=float, default=default.host_kv_bytes,
                   metavar="BYTES",
                   help="with --kv-tier host: host memory for parked KV per region (default "
                        f"{default.host_kv_bytes:.0e}, an assumption: no figure is published)")
    p.add_argument("--draft-tokens", type=int, default=0, metavar="K",
                   help="speculative decoding: tokens the draft (--draft) proposes per verify "
                        "step (default 0: none)")
    p.add_argument("--acceptance", metavar="A|CSV",
                   help="speculative decoding: the probability that each drafted token is "
                        "accepted, or a CSV of draft_tokens,mean_tokens_per_step measured; an "
                        "input, never assumed")
    p.add_argument("--acceptance-seed", type=int, default=0,
                   help="seed of the acceptances drawn (default 0)")


def serving_settings(args) -> dict:
    """The serving options the flags of ``add_serving_args`` give, by parameter name."""
    return {"policy": args.policy, "prefix_cache": args.prefix_cache, "router": args.router,
            "kv_tier": args.kv_tier, "host_kv_bytes": args.host_kv_bytes,
            "draft_tokens": args.draft_tokens, "acceptance": _acceptance(args.acceptance),
            "acceptance_seed": args.acceptance_seed,
            **{f.name: getattr(args, f.name) for f in knob_fields()}}


def _acceptance(text: str | None) -> float | str | None:
    """A probability as a number, anything else as the path of a table."""
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        return text


def knob_values_arg(group, f) -> None:
    """The values of knob ``f`` to try (``Space``), comma-separated; read by
    ``spec_args``."""
    group.add_argument(flag(f.name), default=argparse.SUPPRESS,
                       help=f"{info(f).help} (default: the values each kind of hardware's "
                       f"serving engines use, {_engine_values(f)})")


def _engine_values(f) -> str:
    """A knob's default values as its help states them: each kind's own, a micro-batch's size
    within the kind's tables."""
    def listed(values) -> str:
        return ",".join(map(str, values))
    wafer = listed(info(f).tune)
    server = listed(SERVER_KNOBS.values_of(f.name, info(f)))
    cut = " up to the grid's largest" if info(f).sizes else ""
    return (f"{wafer}{cut}" if wafer == server
            else f"wafers {wafer}{cut}; accelerators and GPUs {server}")
