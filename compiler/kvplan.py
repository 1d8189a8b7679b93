"""The KV plan: what each stage's PEs hold of the KV cache, from what its weights and buffers
leave (``program.kvlayout`` lays the tokens and features out)."""

from __future__ import annotations

import numpy as np

from wse_emu.hardware.fabric import FabricSpec
from wse_emu.models.spec import ModelSpec
from wse_emu.program import kvlayout


def kv_plan(b, model: ModelSpec, fabric: FabricSpec) -> list[dict[str, np.ndarray]]:
    """The KV cache takes what weights and buffers leave, laid out as ``program.kvlayout``
    says: each row of a stage a slice of the K and V features, each column a share of the
    tokens, as many as its tightest PE holds for all of the stage's layers."""
    d = model.storage.dtype_bytes
    out = [{"weights": a["weights"], "activations": a["activations"],
            "kv_cache": np.zeros_like(a["weights"]), "stage": a["stage"]} for a in b.arrays]
    for stage in b.stages:
        r = stage.rect
        arrays = out[r.system]
        if not stage.has_attention:
            stage.kv_slots = stage.kv_capacity_tokens = 0
            continue
        free = np.clip(fabric.usable_bytes_per_pe - arrays["weights"][r.y:r.y1, r.x:r.x1]
                       - arrays["activations"][r.y:r.y1, r.x:r.x1], 0, None)
        grid = free.T if stage.strip_axis == "x" else free  # (long side, rows across)
        capacity = kvlayout.column_capacity(grid, model.attention.kv_size, stage.num_layers, d)
        per_token = kvlayout.token_bytes(model.attention.kv_size, grid.shape[1],
                                         stage.num_layers, d)
        kv = capacity[:, None] * per_token[None, :]
        arrays["kv_cache"][r.y:r.y1, r.x:r.x1] = kv.T if stage.strip_axis == "x" else kv
        stage.kv_capacity_tokens = int(capacity.sum())
        stage.kv_slots = stage.kv_capacity_tokens * model.attention.num_kv_heads
    return out
