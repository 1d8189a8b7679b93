"""Loading YAML configuration into typed dataclasses, with errors that name file and field.

Configs are plain data: loading one has no side effects beyond reading the file.
"""

from __future__ import annotations

import dataclasses
import typing
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from wse_emu.errors import ConfigError

CONFIG_VERSION = 1


def preset_dir(kind: str) -> Path:
    """The folder of shipped presets of one kind ('fabrics' or 'models')."""
    return Path(str(resources.files("programs"))) / kind


def preset_names(kind: str) -> list[str]:
    return sorted(p.stem for p in preset_dir(kind).glob("*.yaml"))


def read_yaml_mapping(path: Path) -> dict[str, Any]:
    """Read a YAML file that must hold a mapping; malformed files raise ConfigError."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise ConfigError(f"{path}: malformed YAML{where}") from None
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
    unknown = sorted(set(data) - set(fields) - set(skip))
    if unknown:
        raise ConfigError(
            f"{source}: unknown field '{unknown[0]}' (allowed: {', '.join(sorted(fields))})"
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


def _coerce(value: Any, hint: Any, where: str) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is typing.Union or str(origin) == "types.UnionType":
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(value, inner[0], where)
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where} must be true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where} must be an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where} must be a number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where} must be a string, got {value!r}")
        return value
    return value


def check_version(data: dict[str, Any], source: str) -> None:
    version = data.get("version", CONFIG_VERSION)
    if version != CONFIG_VERSION:
        raise ConfigError(f"{source}: field 'version' must be {CONFIG_VERSION}, got {version!r}")


def require(condition: bool, source: str, message: str) -> None:
    if not condition:
        raise ConfigError(f"{source}: {message}")
