"""Entry point of the ``wse-emu`` console script.

Every command returns either text or a JSON-able dict; this module prints it. A UserError
becomes one line on stderr and exit code 2; Ctrl-C one line (`wse-emu: interrupted`) and exit
code 130; anything else is a bug and keeps its traceback.

The library's errors (and the reasons it writes into reports) name parameters as the Python
API spells them, in backquotes (`systems`, `prefill_share=0.6`); here each becomes the
command's flag (--systems, --prefill-share 0.6), or the bare name where the command has no
such flag, so a message reads right from either side.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import signal
import sys
import threading

from wse_emu import __version__
from wse_emu.cli.commands import COMMANDS
from wse_emu.cli.flag_names import flags_of, in_flags
from wse_emu.errors import UserError, WorkerLost
from wse_emu.util import progress

EXIT_USAGE = 2
EXIT_FAILED = 1  # the machine could not finish the work (a worker lost, memory exhausted)
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a command Ctrl-C ended


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr (exit 2), like every other error."""

    def error(self, message):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser for ``argv``: every command is listed, but only the one ``argv`` names has
    its module imported and its arguments added."""
    chosen = _command(sys.argv[1:] if argv is None else argv)
    parser = _Parser(prog="wse-emu", description="A wafer-scale hardware emulator with a "
                     "mapping compiler for transformer inference.")
    parser.add_argument("--version", action="version", version=f"wse-emu {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    parser.add_argument("-q", "--quiet", action="store_true",
                        help="no progress lines on stderr (results and errors still print)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name, (module, summary) in COMMANDS.items():
        if name == chosen:
            importlib.import_module(module).add_parser(sub, summary)
        else:
            sub.add_parser(name, help=summary)
    parser.set_defaults(flags=flags_of(sub.choices.get(chosen)))
    return parser


def _command(argv: list[str]) -> str | None:
    """The command ``argv`` names: its first word that is not an option."""
    return next((a for a in argv if not a.startswith("-")), None)


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except KeyboardInterrupt:
        # Ctrl-C, wherever it came (loading a command's modules included): what was started
        # has been ended on the way here (worker processes stopped, files being written
        # removed), so one line says so, after any progress and with nothing after it.
        if argv is None and threading.current_thread() is threading.main_thread():
            # The whole command (not a caller's in-process run): a second Ctrl-C while the
            # interpreter winds down would print a traceback from its exit.
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        progress.end()
        print("wse-emu: interrupted", file=sys.stderr, flush=True)
        if argv is None and _threads_at_work():
            # A thread still at a job nobody will read (a stage-table shape, or Numba compiling
            # on one) would hold the exit until it ends; all of ours is closed by now (worker
            # processes ended, files written whole or not at all), so leave at once.
            sys.stdout.flush()
            os._exit(EXIT_INTERRUPTED)
        return EXIT_INTERRUPTED


def _threads_at_work() -> bool:
    """Whether a thread other than this one would hold the interpreter's exit."""
    return any(t.is_alive() and not t.daemon for t in threading.enumerate()
               if t is not threading.current_thread())


def _main(argv: list[str] | None) -> int:
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(name)s: %(message)s")
    progress.begin(silent=args.quiet)
    try:
        if getattr(args, "viz", False) and not args.output:
            raise UserError("--viz draws the run directory: give one with -o")
        if getattr(args, "writes_run_dir", False) and args.output:
            from wse_emu.rundir.directory import check_run_dir
            check_run_dir(args.output)  # before any work, not after it
        result = args.func(args)
        if getattr(args, "viz", False):
            result = _with_figures(result, args.output)
    except UserError as exc:
        progress.clear()
        # One line, whatever the message held.
        message = in_flags(" ".join(str(exc).split()), getattr(args, "flags", {}))
        print(f"wse-emu: error: {message}", file=sys.stderr)
        return EXIT_USAGE
    except (WorkerLost, MemoryError) as exc:
        # Not the input's fault, and nothing a traceback would explain: what ran out, in one
        # line (the files being written were removed on the way, as for any error).
        progress.clear()
        what = str(exc) if isinstance(exc, WorkerLost) else "out of memory"
        print(f"wse-emu: failed: {' '.join(what.split())}", file=sys.stderr)
        return EXIT_FAILED
    progress.clear()
    try:
        if isinstance(result, dict):
            print(json.dumps(result, indent=1))
        elif result:
            # Reasons the library wrote into a report (a layout skipped, a point failed) name
            # parameters the same way its errors do; a page of Markdown is printed as it is.
            print(result if getattr(args, "verbatim", False)
                  else in_flags(result, getattr(args, "flags", {})))
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (e.g. `| head`): not an error of ours.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    # A command whose output is its verdict (``validate``) says when it failed.
    return getattr(args, "exit_code", 0)


def _with_figures(result, output: str):
    """Draw the run directory just written, and say where the report is."""
    from pathlib import Path

    from wse_emu.visualize.rundraw import draw_run

    report = draw_run(Path(output), ("maps", "roofline", "serving", "experiment"))
    if isinstance(result, dict):
        return {**result, "report": str(report)}
    return f"{result}\nreport: {report}"


if __name__ == "__main__":
    sys.exit(main())
