"""Loading YAML configuration into typed dataclasses, with errors that name file and field.

Configs are plain data: loading one has no side effects beyond reading the file.
"""

from __future__ import annotations

import dataclasses
import math
import os
import types
import typing
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from wse_emu.errors import ConfigError

CONFIG_VERSION = 1


def preset_dir(kind: str) -> Path:
    """The folder of shipped presets of one kind ('fabrics' or 'models')."""
    return Path(str(resources.files("wse_emu.programs"))) / kind


def preset_names(kind: str) -> list[str]:
    return sorted(p.stem for p in preset_dir(kind).glob("*.yaml"))


def shown(value: Any, limit: int = 60) -> str:
    """``repr(value)`` for a one-line message, cut short when long."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def read_text(path: Path) -> str:
    """The UTF-8 text of a config file; unreadable or non-UTF-8 files raise ConfigError."""
    try:
        return path.read_text(encoding="utf-8")
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


def load_named(kind: str, noun: str, name_or_path, from_dict):
    """A preset ``name_or_path`` under ``programs/<kind>/`` or a YAML path, built by
    ``from_dict(mapping, source)``; an unknown name lists the presets."""
    text = str(name_or_path)
    path = Path(text)
    preset = preset_dir(kind) / f"{text}.yaml"
    # A bare preset name is the preset even where the working folder holds a file or a run
    # directory of that name (``-o wse3``); such a file is read as ``./wse3``.
    bare = path.suffix not in (".yaml", ".yml") and "/" not in text and os.sep not in text
    if bare and preset.exists():
        return from_dict(read_yaml_mapping(preset), f"{noun} preset {text}")
    if path.suffix in (".yaml", ".yml") or path.exists():
        return from_dict(read_yaml_mapping(path), str(path))
    if not preset.exists():
        raise ConfigError(f"unknown {noun} '{text}': choose one of "
                          f"{', '.join(preset_names(kind))} or give a YAML path")
    return from_dict(read_yaml_mapping(preset), f"{noun} preset {text}")
