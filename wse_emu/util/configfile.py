"""Loading YAML configuration into typed dataclasses, with errors that name file and field.

Configs are plain data: loading one has no side effects beyond reading the file.
"""

from __future__ import annotations

import dataclasses
import math
import os
import stat
import types
import typing
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from wse_emu.errors import ConfigError

CONFIG_VERSION = 1


def preset_dir(kind: str) -> Path:
    """The folder of shipped presets of one kind ('fabrics', 'models', 'traces', ...)."""
    return Path(str(resources.files("wse_emu.programs"))) / kind


def preset_names(kind: str, suffix: str = ".yaml") -> list[str]:
    """The names of the shipped presets of one kind: their files' stems."""
    return sorted(p.stem for p in preset_dir(kind).glob(f"*{suffix}"))


# What a path that is not a regular file is, by its mode, for the one-line refusal.
_NOT_REGULAR = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                (stat.S_ISSOCK, "a socket"))


def regular_file(path: str | Path) -> Path:
    """``path``, once known to be a regular file or not to exist (its reader reports a missing
    file in its own words). A FIFO would block the read until someone writes to it, a device
    such as /dev/zero never ends, and a directory is not what was asked for, so each is
    refused by name before anything opens it; ``stat`` does not open, so it cannot block."""
    path = Path(path)
    try:
        mode = os.stat(path).st_mode
    except OSError:  # missing or unreachable: the reader says so when it opens it
        return path
    except ValueError:  # no file can be named so; open() would raise this too, untranslated
        raise ConfigError(f"{shown(str(path))}: not a file name (it holds a NUL byte)") from None
    if stat.S_ISREG(mode):
        return path
    kind = next((name for test, name in _NOT_REGULAR if test(mode)), "a special file")
    raise ConfigError(f"{path}: not a regular file ({kind})")


def shown(value: Any, limit: int = 60) -> str:
    """``repr(value)`` for a one-line message, cut short when long."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def read_text(path: Path) -> str:
    """The UTF-8 text of a config file, without the byte-order mark some editors save first;
    unreadable, non-UTF-8 or not regular files raise ConfigError."""
    regular_file(path)
    try:
        return Path(path).read_text(encoding="utf-8-sig")
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (bad byte at offset {exc.start})") from None


# What a configuration may expand to once its aliases are followed: far beyond any real one,
# far below what an alias bomb (a few lines that expand to billions of values) asks for.
MAX_YAML_VALUES = 100_000
MAX_YAML_DEPTH = 64


def _expanded(node, depth: int, seen: dict, path: Path) -> tuple[int, int]:
    """The values and the nesting ``node`` stands for with its aliases followed (each node is
    measured once, so this is quick whatever they expand to); ConfigError past the bounds."""
    if id(node) not in seen:
        if depth > MAX_YAML_DEPTH:
            raise ConfigError(f"{path}: malformed YAML (nested more than {MAX_YAML_DEPTH} deep)")
        if isinstance(node, yaml.MappingNode):
            children = [c for pair in node.value for c in pair]
        elif isinstance(node, yaml.SequenceNode):
            children = node.value
        else:
            children = []
        values, height = 1, 0
        for child in children:
            n, h = _expanded(child, depth + 1, seen, path)
            values, height = values + n, max(height, h + 1)
        seen[id(node)] = (values, height)
    values, height = seen[id(node)]
    if values > MAX_YAML_VALUES:
        raise ConfigError(f"{path}: its aliases expand to more than {MAX_YAML_VALUES:,} values")
    if depth + height > MAX_YAML_DEPTH:
        raise ConfigError(f"{path}: malformed YAML (nested more than {MAX_YAML_DEPTH} deep)")
    return values, height


def _bounded_load(text: str, path: Path):
    """``yaml.safe_load``, once the document's size with its aliases followed is known to be
    within bounds (before any value is built, used or printed)."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _expanded(node, 0, {}, path)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def read_yaml_mapping(path: Path) -> dict[str, Any]:
    """Read a YAML file that must hold a mapping; malformed files, and files whose aliases
    expand beyond any real configuration, raise ConfigError."""
    text = read_text(path)
    try:
        data = _bounded_load(text, path)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise ConfigError(f"{path}: malformed YAML{where}") from None
    except RecursionError:
        raise ConfigError(f"{path}: malformed YAML (nested too deeply)") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of fields, got {type(data).__name__}")
    return data


def build_dataclass(cls: type, data: dict[str, Any], source: str, skip: tuple[str, ...] = ()):
    """Build dataclass ``cls`` from ``data``, checking names and types of every field.

    ``source`` names the file (or other origin) in error messages. Fields in ``skip`` are ignored
    (for keys such as ``version`` that the caller checks itself).
    """
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    unknown = sorted(str(k) for k in set(data) - set(fields) - set(skip))
    if unknown:
        raise ConfigError(
            f"{source}: unknown field {shown(unknown[0])} (allowed: {', '.join(sorted(fields))})"
        )
    values = {}
    for name, field in fields.items():
        if name not in data:
            has_default = (
                field.default is not dataclasses.MISSING
                or field.default_factory is not dataclasses.MISSING
            )
            if not has_default:
                raise ConfigError(f"{source}: missing required field '{name}'")
            continue
        values[name] = _coerce(data[name], hints[name], f"{source}: field '{name}'")
    return cls(**values)


_UNION_TYPES = (typing.Union, types.UnionType)


def _coerce(value: Any, hint: Any, where: str) -> Any:
    origin = typing.get_origin(hint)
    if origin in _UNION_TYPES:
        args = typing.get_args(hint)
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1:
            return _coerce(value, inner[0], where)
        for candidate in inner:
            try:
                return _coerce(value, candidate, where)
            except ConfigError:
                continue
        raise ConfigError(f"{where} has the wrong type, got {shown(value)}")
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where} must be true or false, got {shown(value)}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where} must be an integer, got {shown(value)}")
        return value
    if hint is float:
        return _coerce_float(value, where)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where} must be a string, got {shown(value)}")
        return value
    if origin is tuple:
        # tuple[X, ...]: a YAML or JSON list of X.
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where} must be a list, got {shown(value)}")
        item = typing.get_args(hint)[0]
        return tuple(_coerce(v, item, where) for v in value)
    return value


def _coerce_float(value: Any, where: str) -> float:
    """A finite number; a string such as '1e-5' (which YAML 1.1 leaves a string) is parsed."""
    if isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            raise ConfigError(f"{where} must be a number, got {shown(value)}") from None
    elif isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{where} must be a number, got {shown(value)}")
    else:
        try:
            number = float(value)
        except OverflowError:
            raise ConfigError(f"{where} must be a finite number, got {shown(value)}") from None
    if not math.isfinite(number):
        raise ConfigError(f"{where} must be a finite number, got {shown(value)}")
    return number


def check_version(data: dict[str, Any], source: str) -> None:
    version = data.get("version", CONFIG_VERSION)
    if isinstance(version, bool) or version != CONFIG_VERSION:
        raise ConfigError(
            f"{source}: field 'version' must be {CONFIG_VERSION}, got {shown(version)}")


def require(condition: bool, source: str, message: str) -> None:
    if not condition:
        raise ConfigError(f"{source}: {message}")


def is_preset_name(kind: str, text: str, suffix: str = ".yaml") -> bool:
    """Whether ``text`` is a bare name (no suffix of the kind, no folder) of a shipped preset.
    Such a name is the preset even where the working folder holds a file or a run directory
    of that name (``-o wse3``); such a file is read as ``./wse3``."""
    suffixes = (".yaml", ".yml") if suffix == ".yaml" else (suffix,)
    bare = Path(text).suffix not in suffixes and "/" not in text and os.sep not in text
    return bare and (preset_dir(kind) / f"{text}{suffix}").exists()


def find_named(kind: str, noun: str, name_or_path, suffix: str = ".yaml",
               base: Path | None = None) -> tuple[Path, str]:
    """The file ``name_or_path`` names: a preset under ``programs/<kind>/`` or a path (relative
    to ``base``, when given, else to the working folder), and how messages name it; an unknown
    name lists the presets."""
    text = str(name_or_path)
    suffixes = (".yaml", ".yml") if suffix == ".yaml" else (suffix,)
    preset = preset_dir(kind) / f"{text}{suffix}"
    if is_preset_name(kind, text, suffix):
        return preset, f"{noun} preset {text}"
    path = Path(text) if base is None else Path(base) / text
    if path.suffix in suffixes or path.exists():
        return path, str(path)
    if not preset.exists():
        what = "YAML" if suffix == ".yaml" else suffix.lstrip(".").upper()
        raise ConfigError(f"unknown {noun} '{text}': choose one of "
                          f"{', '.join(preset_names(kind, suffix))} or give a {what} path")
    return preset, f"{noun} preset {text}"


def load_named(kind: str, noun: str, name_or_path, from_dict):
    """A preset ``name_or_path`` under ``programs/<kind>/`` or a YAML path, built by
    ``from_dict(mapping, source)``; an unknown name lists the presets."""
    path, source = find_named(kind, noun, name_or_path)
    return from_dict(read_yaml_mapping(path), source)
