"""FLOPs, bytes moved and arithmetic intensity of every op, for a prefill or a decode step.

The cost of each op is the layer description's (``wse_emu.models.layer.op_cost``). Conventions:
- A prefill processes S new tokens of one sequence after ``prefix`` cached ones (causal
  attention); the final norm and the LM head run on the last position only, the one whose
  logits pick the first output token.
- A decode step processes one new token for each of B sequences, each attending over L cached
  tokens (L counts the new token's own entry; a sliding window caps it, per layer).
- Bytes moved are the unique bytes an op must read or write: its weights (or the embedding
  rows it gathers), its input and output activations, and the KV cache it reads or appends.
  Attention ops are counted unfused (scores are written and read back), as the graph lists them.
- A PE reads SRAM and writes it through separate ports, so an op's memory time is the larger of
  its reads over the read bandwidth and its writes over the write bandwidth. An op is
  compute-bound when its FLOPs take at least that long at the PE's FP16 peak. The ridge point
  shown is FP16 FLOP per cycle over SRAM bytes read per cycle (weights, KV and inputs are reads).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import networkx as nx

from wse_emu.hardware.fabric import FabricSpec
from wse_emu.models.layer import ZERO, MicroBatch, OpCost, op_cost
from wse_emu.models.spec import ModelSpec


@dataclass(frozen=True)
class OpRow:
    node: str
    op: str
    kind: str
    layer: int | None
    cost: OpCost
    bound: str  # "compute" or "memory"

    def to_dict(self) -> dict:
        c = self.cost
        return {"node": self.node, "op": self.op, "kind": self.kind, "layer": self.layer,
                "flops": c.flops, "weight_bytes": c.weight_bytes, "act_bytes": c.act_bytes,
                "kv_bytes": c.kv_bytes, "read_bytes": c.read_bytes,
                "write_bytes": c.write_bytes, "bytes": c.bytes, "intensity": c.intensity,
                "bound": self.bound}


def classify(cost: OpCost, fabric: FabricSpec, dtype_bytes: int = 2) -> str:
    """'compute' when the FLOPs take at least as long as the busier SRAM port, else 'memory'."""
    compute = cost.flops / fabric.flops_per_cycle(dtype_bytes)
    memory = max(cost.read_bytes / fabric.sram_read_bytes_per_cycle,
                 cost.write_bytes / fabric.sram_write_bytes_per_cycle)
    return "compute" if compute >= memory and cost.flops else "memory"


def analyze(g: nx.DiGraph, model: ModelSpec, mb: MicroBatch, fabric: FabricSpec,
            active_experts: float | None = None) -> dict:
    """Per-op rows, per-layer totals and the model total for one step; expert ops read the
    weights of ``active_experts`` experts per layer (default: uniform routing's average)."""
    ridge = fabric.ridge_flop_per_byte()
    rows = []
    for node in nx.topological_sort(g):
        attrs = g.nodes[node]
        cost = op_cost(attrs["spec"], model, mb, attrs["layer"], active_experts)
        rows.append(OpRow(node, attrs["op"], attrs["kind"], attrs["layer"], cost,
                          classify(cost, fabric, model.storage.dtype_bytes)))
    per_layer: dict[int, OpCost] = {}
    total = ZERO
    for row in rows:
        total = total + row.cost
        if row.layer is not None:
            per_layer[row.layer] = per_layer.get(row.layer, ZERO) + row.cost
    return {
        "workload": asdict(mb),
        "ridge_flop_per_byte": ridge,
        "ops": rows,
        "layers": per_layer,
        "total": total,
    }
