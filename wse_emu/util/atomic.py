"""Files written whole or not at all.

Everything wse-emu writes where it is read back (a run directory's JSON, NPZ and CSV, its
trace, figures and report, a program, a sweep's rows, logits) goes through here: a new file is
written under a temporary name beside its final one, synced, and renamed over it only once
complete, so a reader never finds a half-written file under a name it trusts, whatever stops
the writer (a full disk, an error, a kill): ``replacing`` gives a file object to write into,
``replacing_path`` a path for writers that open the file themselves (matplotlib). A line
appended to a file (a sweep's row) is whole or cut back. A file that cannot be written is a
``UserError`` naming it, in one line.

The stage-table cache (``serving/tables.py``) and a weights checkpoint (``weights.py``) keep
their own whole-or-nothing writes.

This module imports nothing of wse_emu but its errors, so the program format, the sweeps, the
run directories' writers and the figures all use it without an import circle.
"""

from __future__ import annotations

import io
import os
import secrets
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

from wse_emu.errors import UserError

PARTIAL = ".partial"  # the suffix of a file being written (``.NAME.<random>.partial``)


def _write(fd: int, data) -> int:
    """One write system call: every byte this module writes passes here (so a test can make
    the disk full at any byte)."""
    return os.write(fd, data)


class WriteError(UserError):
    """A file that could not be written: its ``path`` and the ``reason`` ('No space left on
    device', 'Permission denied', 'Not a directory'), in one line."""

    def __init__(self, path, reason: str):
        super().__init__(f"cannot write {path}: {reason}")
        self.path, self.reason = Path(path), reason


def cannot_write(path, exc: OSError) -> WriteError:
    """The ``WriteError`` of ``exc`` met writing ``path``."""
    return WriteError(path, str(exc.strerror or exc))


def check_writable(path) -> Path:
    """``path``, if a file can be written there: refused, before any work, when its folder
    is missing, not a folder or not writable, or ``path`` is a folder."""
    target = Path(path)
    folder = target.parent
    if target.is_dir():
        raise WriteError(target, "it is a directory")
    if not folder.exists():
        raise WriteError(target, f"no folder {folder}")
    if not folder.is_dir():
        raise WriteError(target, f"{folder} is not a directory")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise WriteError(target, f"{folder} is not writable")
    return target


class _File(io.RawIOBase):
    """A file descriptor whose writes go through ``_write``; seekable, since a zip archive
    (NPZ) goes back to fill in its headers."""

    def __init__(self, fd: int):
        super().__init__()
        self.fd = fd

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def write(self, data) -> int:
        return _write(self.fd, data)

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        return os.lseek(self.fd, offset, whence)

    def tell(self) -> int:
        return os.lseek(self.fd, 0, os.SEEK_CUR)

    def truncate(self, size=None) -> int:
        size = self.tell() if size is None else size
        os.ftruncate(self.fd, size)
        return size

    def fileno(self) -> int:
        return self.fd

    def close(self) -> None:
        if not self.closed:
            try:
                os.close(self.fd)
            finally:
                super().close()


@contextmanager
def replacing(path, text: bool = False, newline: str | None = None):
    """A file object to write ``path``'s new contents into (bytes, or text in UTF-8 with
    ``text``; ``newline`` as ``open`` takes it, '' for csv). The contents take the name only
    when the ``with`` block ends without an error; otherwise nothing is left and ``path``
    keeps what it held. An ``OSError`` (the folder missing or read-only, the disk full) is a
    ``UserError`` naming ``path``."""
    target = Path(path)
    partial = target.with_name(f".{target.name}.{secrets.token_hex(4)}{PARTIAL}")
    try:
        # Created new (never following a link an attacker left), with the umask's mode, as
        # any file the user makes.
        raw = _File(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL
                            | getattr(os, "O_CLOEXEC", 0), 0o666))
    except OSError as exc:
        raise cannot_write(target, exc) from None
    buffered = io.BufferedWriter(raw)
    fh = io.TextIOWrapper(buffered, encoding="utf-8", newline=newline) if text else buffered
    try:
        yield fh
        fh.flush()
        os.fsync(raw.fd)  # the bytes on disk before the name points at them
        fh.close()
        os.replace(partial, target)
    except BaseException as exc:
        try:
            fh.close()  # flushing again may fail the same way: the file goes anyway
        except OSError:
            pass
        raw.close()
        try:
            partial.unlink()
        except OSError:
            pass
        if isinstance(exc, OSError):
            raise cannot_write(target, exc) from None
        raise


@contextmanager
def replacing_path(path):
    """For a writer that opens the file itself (matplotlib saving a figure): a path to write
    ``path``'s new contents to, of the same name, in a new hidden folder beside it. The file
    takes the name ``path`` only when the ``with`` block ends without an error; the folder
    goes in any case. An ``OSError`` is a ``UserError`` naming ``path``."""
    target = Path(path)
    try:
        folder = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=PARTIAL,
                                       dir=target.parent))
    except OSError as exc:
        raise cannot_write(target, exc) from None
    partial = folder / target.name
    try:
        yield partial
        fd = os.open(partial, os.O_RDONLY)
        try:
            os.fsync(fd)  # the bytes on disk before the name points at them
        finally:
            os.close(fd)
        os.replace(partial, target)
    except OSError as exc:
        raise cannot_write(target, exc) from None
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def write_bytes(path, data: bytes) -> Path:
    """``path`` holding ``data``, whole or not at all."""
    with replacing(path) as fh:
        fh.write(data)
    return Path(path)


def write_text(path, text: str) -> Path:
    """``path`` holding ``text`` (UTF-8), whole or not at all."""
    with replacing(path, text=True) as fh:
        fh.write(text)
    return Path(path)


class LineAppender:
    """Lines appended to a file, each whole or not at all: a line the disk could not take
    is cut back off before the error is raised, so the file always ends at a line's end
    (short of a crash mid-line, which a reader of the file must drop: ``sweep.read_rows``)."""

    def __init__(self, path):
        self.path = Path(path)
        try:
            self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND
                              | getattr(os, "O_CLOEXEC", 0), 0o666)
        except OSError as exc:
            raise cannot_write(self.path, exc) from None

    def write_line(self, line: str) -> None:
        """Append ``line`` and a newline, synced to disk."""
        data = memoryview((line + "\n").encode("utf-8"))
        try:
            start = os.lseek(self.fd, 0, os.SEEK_END)
        except OSError as exc:
            raise cannot_write(self.path, exc) from None
        try:
            while data:
                data = data[_write(self.fd, data):]
            os.fsync(self.fd)
        except OSError as exc:
            try:
                os.ftruncate(self.fd, start)
            except OSError:
                pass
            raise cannot_write(self.path, exc) from None

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> "LineAppender":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
