"""``wse-emu sweep SWEEP.yaml``: every combination of a sweep's axes, on worker processes or
a dask cluster, resumable (see ``wse_emu.sweeps.sweep``)."""

from __future__ import annotations

from wse_emu.api import sweep
from wse_emu.sweeps.sweep import MAX_POINTS, RESULTS, load_sweep
from wse_emu.util.fmt import table
from wse_emu.util.progress import Phase


def add_parser(sub, summary: str) -> None:
    p = sub.add_parser("sweep", help=summary)
    p.add_argument("sweep", help="sweep YAML (name, point: run or serve, base and axes), or "
                   "a shipped sweep by name (sram_clock_decode, ...)")
    p.add_argument("-o", "--output", help="directory of the results (default: the sweep's "
                   "name); a sweep stopped midway resumes there")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--scheduler",
                       help="dask scheduler address (default: local worker processes)")
    where.add_argument("--workers", type=int, default=0,
                       help="local worker processes (default: one per core; 1: none, run here)")
    p.add_argument("--max-points", type=int, default=None, dest="max_points",
                   help=f"allow a sweep of more than {MAX_POINTS:,} points")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def run(args):
    spec = load_sweep(args.sweep)
    bar = Phase(f"sweep {spec.name}", spec.size())
    out, rows = sweep(spec, args.output, scheduler=args.scheduler, workers=args.workers,
                      max_points=args.max_points, progress=lambda done, _: bar.update(done))
    total = spec.size()
    if args.json:
        return {"sweep": spec.to_json(), "directory": str(out),
                "rows": [r.to_json() for r in rows]}
    key, label = spec.headline()
    axes = list(spec.axes)
    lines = [[*(str(r.config.get(a)) for a in axes),
              r.error if r.failed else f"{r.result[key]:.4g}"] for r in rows]
    failed = sum(r.failed for r in rows)
    return "\n".join([f"sweep {spec.name}: {len(rows)} of {total} points in {out / RESULTS}"
                      + (f", {failed} failed" if failed else ""), "",
                      table(axes + [label], lines, "l" * len(axes) + "r")])
