"""``wse-emu sweep SWEEP.yaml``: every combination of a sweep's axes, on a dask cluster,
resumable (see ``wse_emu.runtime.sweep``)."""

from __future__ import annotations

from pathlib import Path

from wse_emu.api import check_sweep, evaluate_point
from wse_emu.errors import UserError
from wse_emu.fmt import table
from wse_emu.progress import Phase
from wse_emu.runtime.sweep import (
    MAX_POINTS,
    RESULTS,
    check_size,
    claim_directory,
    load_sweep,
    run_sweep,
)
from wse_emu.runtime.workers import point_pool


def add_parser(sub, summary: str) -> None:
    p = sub.add_parser("sweep", help=summary)
    p.add_argument("sweep", help="sweep YAML: name, point (run or serve), base and axes")
    p.add_argument("-o", "--output", help="directory of the results (default: the sweep's "
                   "name); a sweep stopped midway resumes there")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--scheduler", help="dask scheduler address (default: a local cluster)")
    where.add_argument("--workers", type=int, default=0,
                       help="local worker processes (default: one per core; 1: no cluster)")
    p.add_argument("--max-points", type=int, default=None, dest="max_points",
                   help=f"allow a sweep of more than {MAX_POINTS:,} points")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def run(args):
    spec = load_sweep(args.sweep)
    if args.workers < 0:
        raise UserError(f"--workers must be at least 0, got {args.workers}")
    if args.max_points is not None and args.max_points < 1:
        raise UserError(f"--max-points must be at least 1, got {args.max_points}")
    # Everything the points need checked, and the folder claimed, before the first one runs.
    check_size(spec, args.max_points)
    check_sweep(spec)
    out = Path(args.output or spec.name)
    claim_directory(spec, out)
    total = spec.size()
    bar = Phase(f"sweep {spec.name}", total)
    with point_pool(args.scheduler, args.workers) as pool:
        rows = run_sweep(spec, out, pool, evaluate_point, lambda done, _: bar.update(done))
    if args.json:
        return {"sweep": spec.to_json(), "directory": str(out), "rows": rows}
    key, label = spec.headline()
    axes = list(spec.axes)
    lines = [[*(str(r["config"].get(a)) for a in axes),
              r["error"] if "error" in r else f"{r['result'][key]:.4g}"] for r in rows]
    failed = sum("error" in r for r in rows)
    return "\n".join([f"sweep {spec.name}: {len(rows)} of {total} points in {out / RESULTS}"
                      + (f", {failed} failed" if failed else ""), "",
                      table(axes + [label], lines, "l" * len(axes) + "r")])
