"""Lower a ModelSpec into an op graph (a networkx DiGraph), one node per op.

The ops, their shapes and their inputs are the layer description's (``wse_emu.models.layer``); this
module only stamps that table out for every layer and joins the layers. Nodes carry the op
row itself (``spec``) and, for readers of the graph, its name, kind, layer index (None for the
ops before and after the layers), shape and weight parameters. Edges are data flow.
"""

from __future__ import annotations

import networkx as nx

from wse_emu.models import layer as ly
from wse_emu.models.spec import ModelSpec


def node_id(layer: int | None, op: str) -> str:
    return op if layer is None else f"L{layer}.{op}"


def _add(g: nx.DiGraph, op: ly.Op, layer: int | None) -> str:
    nid = node_id(layer, op.name)
    shape = op.matrix if op.matrix else ((op.length,) if op.weight_params else None)
    attrs = dict(op=op.name, kind=op.kind, layer=layer, spec=op, weight_params=op.weight_params)
    if shape is not None:
        attrs["shape"] = shape
    if op.kind == ly.GEMM:
        attrs["bias"] = op.bias
    g.add_node(nid, **attrs)
    return nid


def build_op_graph(model: ModelSpec) -> nx.DiGraph:
    """The whole model's op graph."""
    g = nx.DiGraph(model=model.name)
    previous = None
    for op in ly.input_ops(model):
        nid = _add(g, op, None)
        g.nodes[nid]["tied"] = model.tie_embeddings
        if previous is not None:
            g.add_edge(previous, nid)
        previous = nid
    for layer in range(model.num_layers):
        for op in ly.layer_ops(model):
            nid = _add(g, op, layer)
            for src in op.inputs:
                g.add_edge(previous if src == ly.LAYER_INPUT else node_id(layer, src), nid)
        previous = node_id(layer, ly.LAYER_OUTPUT)
    for op in ly.output_ops(model):
        nid = _add(g, op, None)
        for src in op.inputs:
            g.add_edge(previous if src == ly.LAYER_INPUT else src, nid)
        if op.name == "lm_head":
            g.nodes[nid]["tied"] = model.tie_embeddings
    return g


def graph_weight_params(g: nx.DiGraph) -> int:
    return sum(d["weight_params"] for _, d in g.nodes(data=True))
