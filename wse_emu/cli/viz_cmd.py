"""``wse-emu viz RUN_DIR``: figures and a self-contained report.html for a run directory."""

from __future__ import annotations

from pathlib import Path

from wse_emu.errors import UserError
from wse_emu.visualize.rundraw import draw_run

FORMATS = ("png", "svg")


def add_parser(sub, summary: str) -> None:
    from wse_emu.visualize.figures import KINDS

    p = sub.add_parser("viz", help=summary)
    p.add_argument("run_dir", help="a directory written by compile, run, serve or experiment "
                   "with -o")
    p.add_argument("--what", default=",".join(KINDS),
                   help=f"figures to draw, comma-separated (default: {','.join(KINDS)})")
    p.add_argument("--format", choices=FORMATS, default="png", help="image format")
    p.add_argument("--system", type=int, default=0, help="which wafer of the cluster to map")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def run(args):
    from wse_emu.visualize.figures import KINDS

    what = tuple(w.strip() for w in args.what.split(",") if w.strip())
    unknown = [w for w in what if w not in KINDS]
    if unknown or not what:
        raise UserError(f"--what takes {', '.join(KINDS)}, got {args.what!r}")
    report = draw_run(Path(args.run_dir), what, (args.format,), args.system)
    if args.json:
        return {"report": str(report), "figures": sorted(str(p) for p in
                                                         (report.parent / "figures").iterdir())}
    return f"wrote {report} and {report.parent / 'figures'}"
