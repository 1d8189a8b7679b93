"""Errors a user can act on.

Every error the command line turns into one line on stderr and exit code 2 derives from
``UserError``; a ``WorkerLost`` (or memory exhausted) is one line and exit code 1. Anything else
escaping to the CLI is a bug in wse-emu and keeps its traceback.
"""


class UserError(Exception):
    """Bad input or an impossible request, explained in one line."""


class ConfigError(UserError):
    """A configuration file or value is malformed or out of range."""


class WorkerLost(RuntimeError):
    """A worker process ended while it held a job (killed for memory, or crashed)."""


class CompileError(UserError):
    """The model cannot be mapped onto the requested cluster (it does not fit, colors run out)."""
