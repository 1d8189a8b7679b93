"""``wse-emu viz RUN_DIR``: figures and a self-contained report.html for a run directory."""

from __future__ import annotations

from pathlib import Path

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
    # The library checks --what (a word it does not know is refused by name, with the kinds).
    report = draw_run(Path(args.run_dir), args.what, (args.format,), args.system)
    if args.json:
        return {"report": str(report), "figures": sorted(str(p) for p in
                                                         (report.parent / "figures").iterdir())}
    return f"wrote {report} and {report.parent / 'figures'}"
