"""Loading a model by what a user names: a preset, a model YAML, or a Hugging Face config.json
(a file or the directory holding it). It stands above both readers (``spec.model_from_dict``
and ``hf_config.model_from_hf_config``)."""

from __future__ import annotations

import json
from pathlib import Path

from wse_emu.errors import ConfigError
from wse_emu.models.hf_config import model_from_hf_config
from wse_emu.models.spec import ModelSpec, model_from_dict
from wse_emu.util.configfile import preset_dir, preset_names, read_text, read_yaml_mapping


def load_model(name_or_path: str | Path) -> ModelSpec:
    """A preset name, a model YAML path, or a Hugging Face config.json (file or directory)."""
    text = str(name_or_path)
    path = Path(text)
    if path.is_dir():
        path = path / "config.json"
        if not path.exists():
            raise ConfigError(f"{text}: directory has no config.json")
    if path.suffix == ".json":
        try:
            config = json.loads(read_text(path))
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}: malformed JSON (line {exc.lineno})") from None
        except RecursionError:
            raise ConfigError(f"{path}: malformed JSON (nested too deeply)") from None
        if not isinstance(config, dict):
            raise ConfigError(f"{path}: expected a JSON object")
        return model_from_hf_config(config, str(path))
    if path.suffix in (".yaml", ".yml") or path.exists():
        return model_from_dict(read_yaml_mapping(path), str(path))
    preset = preset_dir("models") / f"{text.lower()}.yaml"
    if not preset.exists():
        raise ConfigError(
            f"unknown model '{text}': choose one of {', '.join(preset_names('models'))}, "
            "or give a YAML path or a Hugging Face config.json"
        )
    return model_from_dict(read_yaml_mapping(preset), f"model preset {text}")
