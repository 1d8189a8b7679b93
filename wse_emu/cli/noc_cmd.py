"""``wse-emu noc``: synthetic traffic on a k x k mesh with the cycle engine, on the routers
of a fabric (``--fabric``, ``--set``): its virtual channels, queue depth, hop and ramp latency."""

from __future__ import annotations

from wse_emu.cli.fabric_args import add_fabric_args, fabric_from_args
from wse_emu.engines.cycle import MAX_QUEUE_BYTES, queue_bytes
from wse_emu.errors import UserError
from wse_emu.hardware.fabric import MAX_QUEUE_WAVELETS, MAX_VCS, with_overrides
from wse_emu.sim.noc import PATTERNS, find_saturation, run_noc, saturation_bound
from wse_emu.util.fmt import table


def add_parser(sub, summary: str) -> None:
    p = sub.add_parser("noc", help=summary)
    p.add_argument("--mesh", type=int, default=8, help="mesh side k (k x k PEs)")
    p.add_argument("--pattern", choices=PATTERNS, default="uniform")
    rate = p.add_mutually_exclusive_group()
    rate.add_argument("--rate", type=float, help="offered wavelets per PE per cycle")
    rate.add_argument("--rates", help="comma-separated offered rates, for a latency-load curve")
    rate.add_argument("--saturation", action="store_true",
                      help="search for the highest stable offered rate")
    p.add_argument("--engine", choices=["cycle"], default="cycle")
    p.add_argument("--packet", type=int, default=1, help="wavelets per packet")
    p.add_argument("--vcs", type=int,
                   help="colors (virtual channels) per port (default: the fabric's "
                        "virtual_channels)")
    p.add_argument("--queue", type=int,
                   help="wavelets per color queue (default: the fabric's queue_wavelets)")
    p.add_argument("--warmup", type=int, default=1000)
    p.add_argument("--window", type=int, default=4000, help="measured cycles")
    p.add_argument("--drain", type=int, default=4000)
    p.add_argument("--seed", type=int, default=0)
    add_fabric_args(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def run(args):
    if args.mesh < 2 or args.mesh > 1024:
        raise UserError(f"--mesh must be between 2 and 1024, got {args.mesh}")
    for name in ("packet", "vcs", "queue", "window"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise UserError(f"--{name} must be at least 1")
    for name in ("warmup", "drain", "seed"):
        if getattr(args, name) < 0:
            raise UserError(f"--{name} must be at least 0")
    if (args.queue or 0) > MAX_QUEUE_WAVELETS or args.packet > 4096:
        raise UserError(f"--queue must be at most {MAX_QUEUE_WAVELETS} and --packet at most "
                        "4096 wavelets")
    if (args.vcs or 0) > MAX_VCS:
        raise UserError(f"--vcs must be at most {MAX_VCS}")
    fabric = with_overrides(fabric_from_args(args), virtual_channels=args.vcs,
                            queue_wavelets=args.queue)
    if fabric.hop_latency_cycles < 1 or fabric.ramp_latency_cycles < 1:
        raise UserError("the cycle engine needs hop and ramp latency of at least one cycle")
    need = queue_bytes(args.mesh, args.mesh, fabric.virtual_channels, fabric.queue_wavelets)
    if need > MAX_QUEUE_BYTES:
        raise UserError(f"{fabric.virtual_channels} virtual channels of "
                        f"{fabric.queue_wavelets} wavelets on a {args.mesh}x{args.mesh} mesh "
                        f"need {need / 2**30:.1f} GiB of router queues; at most "
                        f"{MAX_QUEUE_BYTES / 2**30:.0f} GiB: lower --vcs, --queue or --mesh")
    kw = dict(fabric=fabric, packet_wavelets=args.packet, warmup=args.warmup,
              window=args.window, drain=args.drain, seed=args.seed,
              check=True)  # every flit injected is delivered or still in flight
    bound = saturation_bound(args.pattern, args.mesh)
    if args.saturation:
        rate, runs = find_saturation(args.mesh, args.pattern, **kw)
        results = runs
        extra = {"saturation_rate": rate,
                 "saturation_fraction_of_bound": rate / bound if (bound and rate) else None}
    else:
        if args.rates:
            try:
                rates = [float(r) for r in args.rates.split(",")]
            except ValueError:
                raise UserError(f"--rates must be numbers separated by commas: {args.rates!r}")
        else:
            rates = [args.rate if args.rate is not None else 0.25 * (bound or 0.4)]
        results = [run_noc(args.mesh, args.pattern, r, **kw) for r in rates]
        extra = {}
    if args.json:
        return {"mesh": args.mesh, "pattern": args.pattern, "engine": args.engine,
                "virtual_channels": fabric.virtual_channels,
                "queue_wavelets": fabric.queue_wavelets, "saturation_bound": bound, **extra,
                "runs": [r.to_dict() for r in results]}
    rows = [[f"{r.offered_rate:.4g}", f"{r.accepted_rate:.4g}", f"{r.latency_mean:.1f}",
             f"{r.latency_p99:.0f}", f"{r.hops_mean:.2f}", f"{r.delivered_fraction:.3f}",
             f"{r.worst_source_slowdown:.2f}"] for r in results]
    head = f"{args.mesh}x{args.mesh} mesh, {args.pattern} traffic, cycle engine"
    if bound:
        head += f"; closed-form saturation {bound:.4g} wavelets/PE/cycle"
    lines = [head, "", table(["offered", "accepted", "latency", "p99", "hops", "delivered",
                              "worst PE slowdown"], rows)]
    if extra:
        frac = extra["saturation_fraction_of_bound"]
        lines.append("")
        if extra["saturation_rate"] is None:
            lines.append("saturation: no offered rate tried was stable")
        else:
            lines.append(f"saturation: {extra['saturation_rate']:.4g} wavelets/PE/cycle"
                         + (f" = {frac:.0%} of the closed form" if frac else ""))
    return "\n".join(lines)
