"""A run directory as a whole: checked before any work (``check_run_dir``: it can be made where
it is named), and written atomically (``write_run_dir``: filled in a sibling temporary folder
that is renamed into place only once every file is written)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from wse_emu.errors import UserError
from wse_emu.util.atomic import WriteError


def _cannot(directory: Path, reason) -> UserError:
    if isinstance(reason, OSError):
        reason = reason.strerror or reason
    return UserError(f"cannot create run directory {directory}: {reason}")


def check_run_dir(directory: str | Path) -> Path:
    """Refuse, before any work, a run directory that ``write_run_dir`` could not create: one
    that exists and is not an empty directory, or whose parent is not a directory or not
    writable."""
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise UserError(f"run directory {directory} exists and is not a directory: "
                        "choose another -o")
    try:
        if directory.exists() and any(directory.iterdir()):
            raise UserError(f"run directory {directory} exists and is not empty: "
                            "choose another -o")
    except OSError as exc:
        raise _cannot(directory, exc) from None
    check_parent(directory)
    return directory


def check_parent(directory: Path) -> None:
    """Refuse a directory that cannot be made where it is named: its nearest parent that
    exists is not a directory, or not writable."""
    for parent in (directory.parent, *directory.parent.parents):
        if parent.exists():
            if not parent.is_dir():
                raise _cannot(directory, f"{parent} is not a directory")
            # The run directory is made beside itself and renamed: its parent takes the writes.
            if not os.access(parent, os.W_OK | os.X_OK):
                raise _cannot(directory, f"{parent} is not writable")
            break


def write_run_dir(directory: str | Path, writer) -> Path:
    """Create ``directory`` atomically: ``writer(tmpdir)`` fills a sibling temp folder which
    is renamed into place only when it succeeds, so a failure leaves nothing half-written.
    An existing non-empty directory is never overwritten."""
    directory = check_run_dir(directory)

    def cannot(reason) -> UserError:
        return _cannot(directory, reason)

    try:
        directory.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    except OSError as exc:
        raise cannot(exc) from None
    try:
        writer(tmp)
        # mkdtemp creates 0700; a run directory is as readable as one made by mkdir. Set the
        # mode before the rename so the directory never appears with the private mode.
        os.chmod(tmp, 0o755)
        if directory.exists():
            directory.rmdir()
        os.replace(tmp, directory)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, OSError):
            raise cannot(exc) from None
        if isinstance(exc, WriteError) and tmp in exc.path.parents:  # not the temp's name
            raise cannot(f"{exc.reason} (writing {exc.path.relative_to(tmp)})") from None
        raise
    return directory
