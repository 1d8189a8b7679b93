"""``wse-emu validate``: every published measurement we compare against, our figure from the
current code, the ratio and its band (``wse_emu.validation``); exit 1 when a check leaves its
band."""

from __future__ import annotations

from wse_emu.cli.main import EXIT_FAILED
from wse_emu.util.progress import status
from wse_emu.validation.catalog import validate
from wse_emu.validation.page import markdown, table
from wse_emu.validation.trn2 import transfer
from wse_emu.validation.waferllm import prefill_by_tile


def add_parser(sub, summary: str) -> None:
    p = sub.add_parser("validate", help=summary)
    p.add_argument("--fast", action="store_true",
                   help="only the checks that take seconds (those the test suite runs)")
    p.add_argument("--only", metavar="TEXT",
                   help="only the checks whose name holds TEXT (case-insensitive)")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true")
    out.add_argument("--page", action="store_true",
                     help="print docs/accuracy.md (Markdown) instead of the table")
    p.set_defaults(func=run)


def run(args):
    outcomes = validate(args.fast, args.only, status)
    if any(o.status == "fail" for o in outcomes):
        args.exit_code = EXIT_FAILED
    if args.json:
        return {"checks": [o.to_json() for o in outcomes],
                "failed": [o.check.name for o in outcomes if o.status == "fail"]}
    if not args.page:
        return table(outcomes)
    args.verbatim = True  # Markdown: its `code` spans stay as they are
    whole = not (args.fast or args.only)
    return markdown(outcomes, prefill_by_tile() if whole else None,
                    transfer() if whole else None)
