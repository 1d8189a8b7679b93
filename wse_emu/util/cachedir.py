"""Where wse-emu keeps what it can make again but would rather not: stage-time tables and
compiled programs, in the user's cache directory."""

from __future__ import annotations

import os
from pathlib import Path


def user_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/wse-emu``, else ``~/.cache/wse-emu`` (not created here)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "wse-emu"
