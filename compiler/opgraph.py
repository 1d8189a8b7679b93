"""Lower a ModelSpec into an op graph (a networkx DiGraph), one node per op.

Nodes carry what the cost model and the mapper need: the op ``kind``, the layer index (None for
the embedding and the head), and the weight matrix or vector it reads. Edges are data flow.
"""

from __future__ import annotations

import networkx as nx

from wse_emu.model import ModelSpec

# Op kinds, with the category the cost model and the mapper dispatch on.
GEMM = "gemm"
EMBEDDING = "embedding"
RMSNORM = "rmsnorm"
ROPE = "rope"
KV_APPEND = "kv_append"
ATTN_SCORES = "attn_scores"
SOFTMAX = "softmax"
ATTN_WEIGHTED_SUM = "attn_weighted_sum"
ADD = "add"
SILU_MUL = "silu_mul"

# One decoder layer in execution order: (op name, kind, inputs within the layer).
# "x" is the layer's input (the residual stream); "h" the residual after attention.
LAYER_OPS: list[tuple[str, str, tuple[str, ...]]] = [
    ("input_norm", RMSNORM, ("x",)),
    ("q_proj", GEMM, ("input_norm",)),
    ("k_proj", GEMM, ("input_norm",)),
    ("v_proj", GEMM, ("input_norm",)),
    ("rope_q", ROPE, ("q_proj",)),
    ("rope_k", ROPE, ("k_proj",)),
    ("kv_append", KV_APPEND, ("rope_k", "v_proj")),
    ("attn_scores", ATTN_SCORES, ("rope_q", "kv_append")),
    ("attn_softmax", SOFTMAX, ("attn_scores",)),
    ("attn_weighted_sum", ATTN_WEIGHTED_SUM, ("attn_softmax", "kv_append")),
    ("o_proj", GEMM, ("attn_weighted_sum",)),
    ("residual_attn", ADD, ("x", "o_proj")),
    ("post_attn_norm", RMSNORM, ("residual_attn",)),
    ("gate_proj", GEMM, ("post_attn_norm",)),
    ("up_proj", GEMM, ("post_attn_norm",)),
    ("silu_mul", SILU_MUL, ("gate_proj", "up_proj")),
    ("down_proj", GEMM, ("silu_mul",)),
    ("residual_mlp", ADD, ("residual_attn", "down_proj")),
]
LAYER_OUTPUT = "residual_mlp"


def node_id(layer: int | None, op: str) -> str:
    return op if layer is None else f"L{layer}.{op}"


def build_op_graph(model: ModelSpec) -> nx.DiGraph:
    """The whole model's op graph; node attributes: op, kind, layer, shape (K, N) or length."""
    g = nx.DiGraph(model=model.name)
    matrices = model.layer_matrices()
    g.add_node("embedding", op="embedding", kind=EMBEDDING, layer=None,
               shape=(model.vocab_size, model.hidden_size),
               weight_params=0 if model.tie_embeddings else model.embedding_params(),
               tied=model.tie_embeddings)
    previous = "embedding"
    for layer in range(model.num_layers):
        for op, kind, inputs in LAYER_OPS:
            nid = node_id(layer, op)
            attrs = dict(op=op, kind=kind, layer=layer)
            if kind == GEMM:
                k, n = matrices[op]
                bias = n if (model.attention_bias and op in ("q_proj", "k_proj", "v_proj")) else 0
                attrs.update(shape=(k, n), weight_params=k * n + bias, bias=bias > 0)
            elif kind == RMSNORM:
                attrs.update(shape=(model.hidden_size,), weight_params=model.hidden_size)
            else:
                attrs.update(weight_params=0)
            g.add_node(nid, **attrs)
            for src in inputs:
                g.add_edge(previous if src == "x" else node_id(layer, src), nid)
        previous = node_id(layer, LAYER_OUTPUT)
    g.add_node("final_norm", op="final_norm", kind=RMSNORM, layer=None,
               shape=(model.hidden_size,), weight_params=model.hidden_size)
    g.add_edge(previous, "final_norm")
    g.add_node("lm_head", op="lm_head", kind=GEMM, layer=None,
               shape=(model.hidden_size, model.vocab_size),
               weight_params=model.vocab_size * model.hidden_size, bias=False,
               tied=model.tie_embeddings)
    g.add_edge("final_norm", "lm_head")
    if model.tie_embeddings:
        # The table is stored once: the LM head owns it, the embedding lookup reads it.
        g.nodes["lm_head"]["weight_params"] = model.vocab_size * model.hidden_size
    return g


def graph_weight_params(g: nx.DiGraph) -> int:
    return sum(d["weight_params"] for _, d in g.nodes(data=True))
