"""Model weights as numpy arrays keyed by Hugging Face tensor names, and checkpoints on disk.

The Llama family (Llama, Mistral, Qwen2) names its tensors ``model.embed_tokens.weight``,
``model.layers.{i}.self_attn.q_proj.weight`` and so on; keeping those names means a checkpoint
written here loads in Hugging Face and a downloaded one loads here. Linear weights keep Hugging
Face's (output, input) layout. A checkpoint is a directory with ``config.json`` (read
by ``wse_emu.models.load.load_model``) and one or more ``*.safetensors`` files. Nothing is
ever downloaded.

``safetensors`` is imported only when a checkpoint is read or written, so the rest of wse-emu
works without it.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from wse_emu.errors import UserError
from wse_emu.models import layer as ly
from wse_emu.models import mxfp4, storage
from wse_emu.models.hf_config import hf_config
from wse_emu.models.load import load_model
from wse_emu.models.spec import ModelSpec
from wse_emu.util.configfile import regular_file
from wse_emu.util.fmt import count

Shape = tuple[int, ...]

# Projections that write into the residual stream; their random init is scaled down by depth.
_RESIDUAL_OUTPUTS = ("self_attn.o_proj.weight", "mlp.down_proj.weight")

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
TOKENIZER_FILE = "tokenizer.json"


def _layer_tensors(spec: ModelSpec) -> dict[str, Shape]:
    """One layer's tensors by module path (as the layer description names them, unfused):
    the input norm, the matrices with their biases, the experts, then the other norms (and
    gpt-oss's attention sinks)."""
    ops = ly.layer_ops(spec)
    first = [op for op in ops if op.name == "input_norm"]
    matrices = [op for op in ops if op.kind == ly.GEMM]
    norms = [op for op in ops if op.kind in ly.NORM_KINDS and op.name != "input_norm"]
    shapes: dict[str, Shape] = {}
    for op in first + matrices + norms:
        if op.kind == ly.GEMM:
            k, n = op.matrix
            shapes[op.tensor + ".weight"] = (n, k)  # nn.Linear stores (out_features, in)
            if op.bias:
                shapes[op.tensor + ".bias"] = (n,)
        else:
            shapes[op.tensor + ".weight"] = (op.weight_params,)
        if op.name == "post_attn_norm" and spec.is_moe:
            shapes.update(_expert_tensors(spec))
    sinks = [op for op in ops if op.kind == ly.SOFTMAX and op.weight_params]
    shapes.update({op.tensor: (op.weight_params,) for op in sinks})
    return shapes


def _expert_tensors(spec: ModelSpec) -> dict[str, Shape]:
    """The experts' tensors as the family stores them: one module per expert (Mixtral, Qwen3),
    or all experts in one tensor, gate and up interleaved, stored (in, out) (gpt-oss)."""
    e, h, m = spec.experts.count, spec.hidden_size, spec.experts.intermediate_size
    _, gate, up, down = spec.family_record.expert_tensors
    if spec.family_record.experts_stored_together:
        return {gate: (e, h, 2 * m), gate + "_bias": (e, 2 * m), down: (e, m, h),
                down + "_bias": (e, h)}
    out: dict[str, Shape] = {}
    for i in range(e):
        out[gate.format(e=i) + ".weight"] = (m, h)
        out[up.format(e=i) + ".weight"] = (m, h)
        out[down.format(e=i) + ".weight"] = (h, m)
    return out


def expert_strips(spec: ModelSpec, weights: Mapping[str, np.ndarray], layer: int,
                  per_run: int = 1, experts: tuple[int, int] | None = None
                  ) -> dict[str, np.ndarray]:
    """One layer's experts (``experts``: the range one part of a split layer holds; all by
    default) as the compiler lays them out (``ly.Op.run_matrix``), one after another along the
    inputs: gate and up as (E / per_run x hidden, per_run x m), each run's experts side by
    side in its outputs; down as (E x m, hidden), in expert order (E: the experts held); with
    ``<name>.bias`` (gate, up: E x m; down: (every expert of the layer, hidden), indexed by
    expert id) where the family has expert biases."""
    e0, e1 = experts if experts is not None else (0, spec.experts.count)
    held = range(e0, e1)
    p = f"model.layers.{layer}."
    _, gate, up, down = spec.family_record.expert_tensors

    def runs(per_expert: list[np.ndarray]) -> np.ndarray:  # each (hidden, m)
        return np.concatenate([np.concatenate(per_expert[r:r + per_run], axis=1)
                               for r in range(0, len(per_expert), per_run)], axis=0)

    if spec.family_record.experts_stored_together:
        # gate_up (E, h, 2m), down (E, m, h), stored (in, out)
        gate_up, bias = weights[p + gate], weights[p + gate + "_bias"]  # (E, h, 2m), (E, 2m)
        return {"experts_gate": runs(list(gate_up[e0:e1, :, 0::2])),
                "experts_up": runs(list(gate_up[e0:e1, :, 1::2])),
                "experts_down": np.concatenate(list(weights[p + down][e0:e1]), axis=0),
                "experts_gate.bias": bias[e0:e1, 0::2].reshape(-1),
                "experts_up.bias": bias[e0:e1, 1::2].reshape(-1),
                "experts_down.bias": weights[p + down + "_bias"]}

    return {
        "experts_gate": runs([weights[p + gate.format(e=i) + ".weight"].T for i in held]),
        "experts_up": runs([weights[p + up.format(e=i) + ".weight"].T for i in held]),
        "experts_down": np.concatenate([weights[p + down.format(e=i) + ".weight"].T
                                        for i in held], axis=0),
    }


def as_stored(spec: ModelSpec, weights: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The weights as the wafer stores them (``wse_emu.models.storage``): every matrix in its format
    (the experts' in ``expert_weight_format``, the others, embedding and LM head included, in
    ``weight_format``), each expert a matrix of its own; norms, biases and sinks as given. A
    checkpoint's values already in their format pass unchanged."""
    out = dict(weights)
    if spec.storage.weight_format == "native" and spec.storage.expert_weight_format == "native":
        return out
    for name, w in weights.items():
        expert = ".experts." in name
        fmt = spec.storage.expert_weight_format if expert else spec.storage.weight_format
        if fmt == "native" or name.endswith(("_bias", ".bias")) or w.ndim < 2:
            continue
        if w.ndim == 3:  # gpt-oss: all experts in one tensor, each (in, out)
            out[name] = np.stack([storage.stored_matrix(fmt, m, name) for m in w])
        else:  # Hugging Face's (out, in)
            out[name] = storage.stored_matrix(fmt, w.T, name).T
    return out


def _fuse(spec: ModelSpec, shapes: dict[str, Shape]) -> dict[str, Shape]:
    """The layer's tensors as the family's checkpoints store them."""
    out = dict(shapes)
    for fused, parts in spec.family_record.fused.items():
        rows = [shapes[p + ".weight"] for p in parts]
        at = list(out).index(parts[0] + ".weight")
        items = [(k, v) for k, v in out.items() if k not in {p + ".weight" for p in parts}]
        items.insert(at, (fused + ".weight", (sum(r[0] for r in rows), rows[0][1])))
        out = dict(items)
    return out


def expected_shapes(spec: ModelSpec) -> dict[str, Shape]:
    """Every tensor the model needs, by Hugging Face name, in checkpoint order."""
    h = spec.hidden_size
    shapes: dict[str, Shape] = {"model.embed_tokens.weight": (spec.vocab_size, h)}
    layer = _fuse(spec, _layer_tensors(spec))
    for index in range(spec.num_layers):
        prefix = f"model.layers.{index}."
        shapes.update({prefix + name: shape for name, shape in layer.items()})
    shapes["model.norm.weight"] = (h,)
    if not spec.tie_embeddings:
        shapes["lm_head.weight"] = (spec.vocab_size, h)
    return shapes


def unfused(spec: ModelSpec, weights: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The weights with fused tensors split into the layer description's matrices (views)."""
    out = dict(weights)
    for fused, parts in spec.family_record.fused.items():
        sizes = [_layer_tensors(spec)[p + ".weight"][0] for p in parts]
        for index in range(spec.num_layers):
            prefix = f"model.layers.{index}."
            whole = out.pop(prefix + fused + ".weight")
            start = 0
            for part, size in zip(parts, sizes):
                out[prefix + part + ".weight"] = whole[start:start + size]
                start += size
    return out


def check_weights(spec: ModelSpec, weights: Mapping[str, Any], where: str,
                  implied_by: str = "the model") -> None:
    """Raise UserError naming the first missing, unexpected, misshapen or non-float tensor.

    ``where`` starts the message (a checkpoint path, say) and ``implied_by`` names what the
    expected shape comes from, so the user knows which of the two to fix.
    """
    shapes = expected_shapes(spec)
    for name, shape in shapes.items():
        if name not in weights:
            raise UserError(f"{where}: missing tensor {name} (shape {_shown(shape)})")
        array = weights[name]
        if not isinstance(array, np.ndarray):
            raise UserError(f"{where}: {name} is a {type(array).__name__}, not a numpy array")
        if array.shape != shape:
            raise UserError(f"{where}: {name} has shape {_shown(array.shape)}, "
                            f"{implied_by} implies {_shown(shape)}")
        if not np.issubdtype(array.dtype, np.floating):
            raise UserError(f"{where}: {name} has dtype {array.dtype}, expected floating point")
    for name in weights:
        if name not in shapes:
            raise UserError(f"{where}: unexpected tensor {name!r}, "
                            f"{implied_by} implies no such tensor")


def random_weights(spec: ModelSpec, seed: int, dtype: Any = np.float32) -> dict[str, np.ndarray]:
    """Seeded random weights under which activations stay O(1) through the whole model.

    Values are drawn in float32 in ``expected_shapes`` order from one generator, so the same seed
    gives the same values in every dtype (a float64 set is the float32 set, widened).
    """
    dtype = _float_dtype(dtype)
    rng = np.random.default_rng(seed)
    # Each residual branch adds a term of size ~1/sqrt(2 * layers): the stream stays O(1) deep.
    residual_scale = 1.0 / math.sqrt(2 * spec.num_layers)
    weights = {}
    for name, shape in expected_shapes(spec).items():
        noise = rng.standard_normal(shape, dtype=np.float32)
        if name.endswith("norm.weight"):
            # The scale applied is offset + w: near one, but not all ones, so a skipped scale
            # shows.
            value = 1.0 - spec.norm.weight_offset + 0.1 * noise
        elif name.endswith((".bias", "_bias", ".sinks")):
            value = 0.1 * noise
        else:
            # Matrices, including the embedding (it is also the LM head when tied): unit-variance
            # input -> unit-variance output, so attention scores and logits stay O(1). Experts
            # stored (in, out) (gpt-oss) have their inputs in the middle.
            fan_in = shape[1] if len(shape) == 2 else shape[-2]
            value = noise / math.sqrt(fan_in)
            if name.endswith(_RESIDUAL_OUTPUTS) or ".w2." in name or \
                    name.endswith(("down_proj.weight", "experts.down_proj")):
                value *= residual_scale
        weights[name] = value.astype(dtype)
    return weights


def save_checkpoint(directory: str | Path, spec: ModelSpec,
                    weights: Mapping[str, np.ndarray]) -> None:
    """Write ``config.json`` and ``model.safetensors`` into ``directory`` (created if needed).

    The weights are checked first, so bad ones leave nothing behind; each file is written under
    a temporary name and renamed, so a failed write never leaves a half file under the real one.
    """
    directory = Path(directory)
    check_weights(spec, weights, f"weights for {spec.name}")
    save_file = _safetensors_numpy().save_file
    try:
        directory.mkdir(parents=True, exist_ok=True)
        tensors = {}
        for name in expected_shapes(spec):
            tensors.update(_packed(spec, name, weights[name]))
        partial = directory / (WEIGHTS_FILE + ".partial")
        # "format": "pt" is the metadata Hugging Face's loader asks of a safetensors file.
        save_file(tensors, str(partial), metadata={"format": "pt"})
        os.replace(partial, directory / WEIGHTS_FILE)
        partial = directory / (CONFIG_FILE + ".partial")
        partial.write_text(json.dumps(hf_config(spec), indent=2) + "\n", encoding="utf-8")
        os.replace(partial, directory / CONFIG_FILE)
    except OSError as exc:
        raise UserError(f"cannot write checkpoint {directory}: {exc.strerror or exc}") from None


def load_checkpoint(path: str | Path,
                    dtype: Any = np.float32) -> tuple[ModelSpec, dict[str, np.ndarray]]:
    """Read a checkpoint directory (or its ``config.json``): the model and its weights in dtype.

    Every ``*.safetensors`` file of the directory is read (sharded checkpoints have several).
    Tensors the model does not use but checkpoints commonly carry are dropped: rotary
    ``inv_freq`` buffers, and a copy of the LM head when the embeddings are tied.
    """
    dtype = _float_dtype(dtype)
    path = Path(path)
    if not path.exists():
        raise UserError(f"checkpoint {path}: no such file or directory")
    if path.is_dir():
        directory, config_path = path, path / CONFIG_FILE
    elif path.suffix == ".json":
        directory, config_path = path.parent, path
    else:
        raise UserError(f"checkpoint {path}: give the checkpoint directory or its {CONFIG_FILE}")
    if not config_path.exists():
        raise UserError(f"checkpoint {directory}: no {CONFIG_FILE}")
    spec = load_model(config_path)
    where = f"checkpoint {directory}"
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise UserError(f"{where}: no *.safetensors files")
    weights: dict[str, np.ndarray] = {}
    found_in: dict[str, str] = {}
    for file in files:
        for name, array in _read_safetensors(file, where).items():
            if name in found_in:
                raise UserError(f"{where}: tensor {name} is in both {found_in[name]} "
                                f"and {file.name}")
            found_in[name] = file.name
            weights[name] = array
    _unpack_mxfp4(spec, weights, where)
    for name in list(weights):
        if name.endswith("rotary_emb.inv_freq") or (spec.tie_embeddings
                                                    and name == "lm_head.weight"):
            del weights[name]
    check_weights(spec, weights, where, implied_by=CONFIG_FILE)
    return spec, {name: weights[name].astype(dtype, copy=False) for name in expected_shapes(spec)}


# --- MXFP4 experts on disk ------------------------------------------------------------------

MXFP4_PARTS = ("_blocks", "_scales")


def _mxfp4_tensors(spec: ModelSpec) -> set[str]:
    """gpt-oss's expert matrices (E, in, out), which its checkpoints keep as MXFP4 blocks."""
    family = spec.family_record
    if family.mxfp4_experts is None or spec.storage.expert_weight_format != "mxfp4":
        return set()
    _, gate, _, down = family.expert_tensors
    return {f"model.layers.{i}.{t}" for i in range(spec.num_layers) for t in (gate, down)}


def _packed(spec: ModelSpec, name: str, array: np.ndarray) -> dict[str, np.ndarray]:
    """A tensor as the family's checkpoints store it: an MXFP4 expert matrix (E, in, out) as
    its blocks and scales over (E, out, in / 32), everything else as it is."""
    if name not in _mxfp4_tensors(spec):
        return {name: np.ascontiguousarray(array)}
    blocks, scales = mxfp4.encode(np.swapaxes(array, 1, 2), name)
    return {name + "_blocks": blocks, name + "_scales": scales}


def _unpack_mxfp4(spec: ModelSpec, weights: dict[str, np.ndarray], where: str) -> None:
    """Replace each MXFP4 blocks-and-scales pair by the matrix it holds, (E, in, out)."""
    packed = {n[:-len(part)] for n in weights for part in MXFP4_PARTS if n.endswith(part)}
    wanted = _mxfp4_tensors(spec)
    for name in sorted(packed):
        if name not in wanted:
            raise UserError(f"{where}: {name} is stored as MXFP4 blocks, but {CONFIG_FILE} "
                            "does not declare its experts MXFP4 (quantization_config)")
        missing = [name + part for part in MXFP4_PARTS if name + part not in weights]
        if missing:
            raise UserError(f"{where}: missing tensor {missing[0]} beside its MXFP4 pair")
        blocks, scales = (weights.pop(name + part) for part in MXFP4_PARTS)
        if blocks.dtype != np.uint8 or scales.dtype != np.uint8 or blocks.ndim != 4 \
                or blocks.shape[:-1] != scales.shape or blocks.shape[-1] != mxfp4.BLOCK // 2:
            raise UserError(f"{where}: {name}_blocks {_shown(blocks.shape)} and _scales "
                            f"{_shown(scales.shape)} are not MXFP4 blocks and their scales "
                            "(uint8, (E, rows, groups, 16) and (E, rows, groups))")
        weights[name] = np.swapaxes(mxfp4.dequantize(blocks, scales), 1, 2)


# --- helpers --------------------------------------------------------------------------------

def _read_safetensors(file: Path, where: str) -> dict[str, np.ndarray]:
    regular_file(file)
    safetensors_numpy = _safetensors_numpy()
    try:
        return safetensors_numpy.load_file(str(file))
    except TypeError as exc:
        # numpy has no bfloat16, the dtype most released checkpoints use: widen it by hand.
        if "bfloat16" not in str(exc):
            raise UserError(f"{where}: cannot read {file.name}: {_one_line(exc)}") from None
    except Exception as exc:  # SafetensorError (bad header, truncated data), OSError, ...
        raise UserError(f"{where}: cannot read {file.name}: {_one_line(exc)}") from None
    return _read_with_bfloat16(file, where)


def _read_with_bfloat16(file: Path, where: str) -> dict[str, np.ndarray]:
    from safetensors import deserialize

    try:
        entries = deserialize(file.read_bytes())
    except Exception as exc:
        raise UserError(f"{where}: cannot read {file.name}: {_one_line(exc)}") from None
    tensors = {}
    for name, entry in entries:
        raw = np.frombuffer(entry["data"], dtype=np.uint8)
        if entry["dtype"] == "BF16":
            # bfloat16 is the top half of a float32: shift it into place.
            array = (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            numpy_dtype = _SAFETENSORS_DTYPES.get(entry["dtype"])
            if numpy_dtype is None:
                raise UserError(f"{where}: {name} in {file.name} has unsupported dtype "
                                f"{entry['dtype']}")
            array = raw.view(numpy_dtype)
        tensors[name] = array.reshape(entry["shape"])
    return tensors


_SAFETENSORS_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4",
                       "I16": "<i2", "I8": "i1", "U8": "u1", "BOOL": "?"}


def _safetensors_numpy():
    try:
        import safetensors.numpy
    except ImportError:
        raise UserError("reading or writing checkpoints needs safetensors: "
                        "pip install safetensors") from None
    return safetensors.numpy


def _float_dtype(dtype: Any) -> np.dtype:
    try:
        result = np.dtype(dtype)
    except TypeError:
        raise UserError(f"dtype must be a floating-point numpy dtype, got {dtype!r}") from None
    if not np.issubdtype(result, np.floating):
        raise UserError(f"dtype must be a floating-point numpy dtype, got {result}")
    return result


def _shown(shape: Shape) -> str:
    return "(" + ", ".join(str(n) for n in shape) + ")"


def _one_line(exc: Exception) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


def checkpoint_dir(path: Path) -> Path | None:
    """The checkpoint directory ``path`` names: a directory, or a ``config.json`` with
    ``*.safetensors`` beside it; None for a preset, a YAML or a bare config.json."""
    if path.is_dir():
        return path
    if path.name == CONFIG_FILE and path.exists() and any(path.parent.glob("*.safetensors")):
        return path.parent
    return None


def model_and_weights(model_or_checkpoint: str | Path, weights_seed: int = 0):
    """(model, weights, where the weights came from): a checkpoint's (see ``checkpoint_dir``),
    or, for anything else ``load_model`` takes, random ones drawn from ``weights_seed``."""
    path = Path(model_or_checkpoint)
    if checkpoint_dir(path) is not None:
        check_memory(load_model(str(checkpoint_dir(path) / CONFIG_FILE)))
        model, weights = load_checkpoint(path)
        return model, weights, str(path)
    model = load_model(str(model_or_checkpoint))
    check_memory(model)
    return model, random_weights(model, weights_seed), f"random (seed {weights_seed})"


def check_memory(model: ModelSpec) -> None:
    """Refuse a model whose weights alone, in float32 as the functional engine holds them
    (and again as tiles), exceed this machine's memory: loading it could only end with the
    process killed, and nothing said."""
    need = model.params() * 4
    try:
        have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):  # not a POSIX system: nothing to check
        return
    if need > have:
        raise UserError(f"{model.name}: its {count(model.params())} parameters take "
                        f"{need / 1e9:.3g} GB in float32, more than this machine's "
                        f"{have / 1e9:.3g} GB of memory; the functional engine computes models "
                        "that fit (`run` times any model)")


def tokenizer_for(model_or_checkpoint: str | Path):
    """The checkpoint's tokenizer, if it has one and ``tokenizers`` is installed."""
    directory = checkpoint_dir(Path(model_or_checkpoint))
    file = None if directory is None else directory / TOKENIZER_FILE
    if file is None or not file.exists():
        return None
    try:
        from tokenizers import Tokenizer
    except ImportError:
        return None
    regular_file(file)
    try:
        return Tokenizer.from_file(str(file))
    except Exception as exc:  # the library raises its own exception types
        raise UserError(f"{file}: cannot read the tokenizer: {' '.join(str(exc).split())}") \
            from None
