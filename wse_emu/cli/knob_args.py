"""The serving knobs' flags, made from their declarations (``wse_emu.serving.knobs``): one
flag per knob, named as its parameter (``prefill_tile`` -> ``--prefill-tile``), with its
declared default and help. ``serve`` takes one value each; ``experiment disagg`` takes the
values to try, comma-separated, defaulting to the values the declaration tunes. The values are
checked where they are used (``ServeOptions``, ``Space``); here they are only read."""

from __future__ import annotations

from wse_emu.errors import UserError
from wse_emu.experiments.comparison import DEPTH_RULES
from wse_emu.pools.kinds.base import SERVER_KNOBS
from wse_emu.serving.knobs import info, knob_fields
from wse_emu.serving.policies import POLICIES
from wse_emu.serving.serve import ServeOptions


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
                   help="recompute every agentic call's whole context (by default a call "
                        "reuses its session's KV while it is still cached)")


def serving_settings(args) -> dict:
    """The serving options the flags of ``add_serving_args`` give, by parameter name."""
    return {"policy": args.policy, "prefix_cache": args.prefix_cache,
            **{f.name: getattr(args, f.name) for f in knob_fields()}}


def add_space_args(p, copies: tuple) -> None:
    """The values to try of every knob, of the copies per wafer and of the colocated policy;
    the experiment tunes them one at a time, in this order."""
    group = p.add_argument_group(
        "knobs", "values to tune each plan over, comma-separated (one value fixes the knob); "
        "the knobs are tuned one at a time, in this order, for both plans")
    group.add_argument("--policy", default=",".join(POLICIES),
                       help=f"colocated batching policies (default {','.join(POLICIES)})")
    group.add_argument("--copies", default=",".join(map(str, copies)),
                       help="copies of the model per wafer, colocated (side by side in column "
                            f"bands; a model on one wafer only; default "
                            f"{','.join(map(str, copies))})")
    group.add_argument("--layers-per-stage", default="matched", metavar="matched|own|L1,L2",
                       help="pipeline depths (layers per stage) to try every layout of both "
                            "plans at: matched (default), every depth some layout comes to by "
                            "itself; own, each layout at its own; or these, besides its own")
    for f in knob_fields():
        group.add_argument(flag(f.name), help=f"{info(f).help} (default: the values each kind "
                           f"of hardware's serving engines use, {_engine_values(f)})")


def space_settings(args) -> dict:
    """The values to try the flags of ``add_space_args`` give, by parameter name."""
    return {"policy": tuple(v.strip() for v in args.policy.split(",") if v.strip()),
            "copies": _ints(args.copies, "copies"),
            "layers_per_stage": (args.layers_per_stage if args.layers_per_stage in DEPTH_RULES
                                 else _ints(args.layers_per_stage, "layers_per_stage")),
            **{f.name: None if getattr(args, f.name) is None else
               _ints(getattr(args, f.name), f.name) for f in knob_fields()}}


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


def _ints(text: str, name: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise UserError(f"`{name}` must be comma-separated whole numbers, got {text!r}") \
            from None
