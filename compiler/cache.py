"""Compiled programs kept between processes.

The same model, cluster and options, compiled by the same code, give the same program: a second
``wse-emu serve`` or ``run`` of a model, or a second experiment over the same layouts (which
keeps them beside its stage tables, ``experiments.wafer_layouts``), reads it back (program.json
and program.npz, digest checked: about a seventh of the compile's time for Llama-3.1-8B on a
WSE-3) instead of compiling it again. The key holds everything a program is made from: the
model's and the fabric's full descriptions, the systems, every compile option, and the source of
the compiler and of the package modules it reads (so that an edit to any of them compiles
afresh). A kernel pattern registered from outside the package (``patterns.register``) is code
the key cannot see: with one registered, nothing is cached.

The cache is a convenience, never a source of truth: an entry that cannot be read is compiled
again, and one that cannot be written is skipped.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
from functools import lru_cache
from pathlib import Path

from wse_emu.errors import UserError
from wse_emu.hardware.fabric import ClusterSpec
from wse_emu.models.spec import ModelSpec
from wse_emu.program.format import WaferProgram
from wse_emu.program.options import CompileOptions
from wse_emu.util.cachedir import user_cache_dir

# Programs kept at most; the least recently used go first (an 8B program is about 0.9 MB).
MAX_PROGRAMS = 64
# The package folders whose code a compiled program depends on, besides the compiler's own.
COMPILED_FROM = ("hardware", "kernels", "models", "program", "util")
# The folder programs are kept in, under a cache folder that may hold other things too (the
# stage tables).
PROGRAMS = "programs"


def programs_in(cache_dir: Path | None) -> Path:
    """Where programs are kept under the cache folder ``cache_dir`` (None: the user's)."""
    return (Path(cache_dir) if cache_dir is not None else user_cache_dir()) / PROGRAMS


def compile_kept(model: ModelSpec, cluster: ClusterSpec, options: CompileOptions, compile_fn,
                 cache: Path | None) -> WaferProgram:
    """``compile_cached`` into the programs folder of the cache folder ``cache``, where stage
    tables are kept too (None: compiled, not kept)."""
    if cache is None:
        return compile_fn(model, cluster, options)
    return compile_cached(model, cluster, options, compile_fn, programs_in(cache))


def compile_cached(model: ModelSpec, cluster: ClusterSpec, options: CompileOptions,
                   compile_fn, cache_dir: Path | None = None) -> WaferProgram:
    """``compile_fn(model, cluster, options)``'s program, read from the cache when it holds
    one for these inputs and this code, else compiled and kept there."""
    folder = Path(cache_dir) if cache_dir is not None else programs_in(None)
    key = program_key(model, cluster, options)
    if key is None:
        return compile_fn(model, cluster, options)
    entry = folder / key
    program = _read(entry)
    if program is None:
        program = compile_fn(model, cluster, options)
        _keep(program, folder, entry)
    return program


def program_key(model: ModelSpec, cluster: ClusterSpec, options: CompileOptions) -> str | None:
    """The cache key of a compile, or None when code outside the package takes part in it."""
    # Patterns are registered through their module, so a process that has not imported it
    # has none from outside (and is spared its import, with the engines under it).
    patterns = sys.modules.get("wse_emu.kernels.patterns")
    if patterns is not None and any(not type(p).__module__.startswith("wse_emu.")
                                    for p in patterns.entries()):
        return None
    what = {"model": model.to_dict(), "fabric": cluster.fabric.to_dict(),
            "systems": cluster.systems, "options": options.to_dict()}
    if options.draft is not None:  # a file it names may change under the same name
        from wse_emu.compiler.draft import draft_model  # the partitioner under it: only here

        what["draft"] = draft_model(model, options.draft).to_dict()
    digest = hashlib.sha256(_code_digest().encode())
    digest.update(json.dumps(what, sort_keys=True, default=str).encode())
    return digest.hexdigest()[:32]


@lru_cache(maxsize=1)
def _code_digest() -> str:
    """A digest of the compiler's source and of the package modules it reads, taken once."""
    compiler = Path(__file__).resolve().parent
    package = Path(sys.modules[UserError.__module__].__file__).resolve().parent  # wse_emu/
    files = sorted([*compiler.rglob("*.py"), package / "errors.py",
                    *(f for name in COMPILED_FROM for f in (package / name).rglob("*.py"))])
    digest = hashlib.sha256()
    for f in files:
        digest.update(f.name.encode())
        digest.update(f.read_bytes())
    return digest.hexdigest()


def _read(entry: Path) -> WaferProgram | None:
    if not (entry / "program.json").is_file():
        return None
    try:
        program = WaferProgram.load(entry, written_here=True)
    except (UserError, OSError):
        return None  # damaged or half-removed: compiled again, and written over
    try:
        os.utime(entry)  # most recently used
    except OSError:
        pass
    return program


def _keep(program: WaferProgram, folder: Path, entry: Path) -> None:
    """Write ``program`` to ``entry`` whole or not at all (into a new folder, then renamed:
    a process racing to keep the same program finds one or the other whole), then drop the
    least recently used programs beyond ``MAX_PROGRAMS``."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        partial = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", dir=folder))
    except OSError:
        return
    try:
        program.save(partial)
        if entry.exists():
            shutil.rmtree(entry, ignore_errors=True)
        os.replace(partial, entry)
    except (UserError, OSError):
        pass
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    _prune(folder)


def _prune(folder: Path) -> None:
    try:
        kept = sorted((p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")),
                      key=lambda p: p.stat().st_mtime)
    except OSError:
        return
    for old in kept[:-MAX_PROGRAMS]:
        shutil.rmtree(old, ignore_errors=True)
