"""The op graph and its FLOPs, bytes and arithmetic intensity, against hand counts."""

import networkx as nx
import pytest

from wse_emu.compiler.intensity import analyze
from wse_emu.compiler.opgraph import build_op_graph, graph_weight_params
from wse_emu.hardware.fabric import load_fabric
from wse_emu.models.layer import MicroBatch, op_cost, ops_by_name
from wse_emu.models.load import load_model

WSE3 = load_fabric("wse3")


def rows_by_node(model_name, work):
    model = load_model(model_name)
    result = analyze(build_op_graph(model), model, work, WSE3)
    return {r.node: r for r in result["ops"]}, result


def test_graph_is_a_dag_holding_every_weight_once():
    for name in ("llama-3.1-8b", "llama-3.2-1b", "qwen2.5-7b"):
        model = load_model(name)
        g = build_op_graph(model)
        assert nx.is_directed_acyclic_graph(g)
        assert graph_weight_params(g) == model.params()
        assert g.number_of_nodes() == 3 + 18 * model.num_layers


def test_tied_embedding_is_read_by_the_lookup_and_owned_by_the_head():
    g = build_op_graph(load_model("llama-3.2-1b"))
    assert g.nodes["embedding"]["weight_params"] == 0
    assert g.nodes["lm_head"]["weight_params"] == 128256 * 2048


def test_fp16_elementwise_add_is_one_sixth():
    rows, _ = rows_by_node("llama-3.1-8b", MicroBatch("decode", batch=1, context=4096))
    add = rows["L0.residual_attn"]
    assert add.cost.flops == 4096
    assert add.cost.bytes == 6 * 4096
    assert add.cost.intensity == pytest.approx(1 / 6)
    assert add.bound == "memory"


def test_decode_gemv_is_about_one_flop_per_byte_and_memory_bound():
    rows, _ = rows_by_node("llama-3.1-8b", MicroBatch("decode", batch=1, context=4096))
    q = rows["L0.q_proj"]
    assert q.cost.flops == 2 * 4096 * 4096
    assert q.cost.weight_bytes == 2 * 4096 * 4096
    assert q.cost.intensity == pytest.approx(1.0, rel=1e-3)
    # Reads of the weights take as long as the FLOPs at the ridge; the activations tip it.
    assert q.bound == "memory"
    assert rows["L0.gate_proj"].bound == "memory"


def test_batched_decode_gemv_crosses_the_ridge():
    rows, _ = rows_by_node("llama-3.1-8b", MicroBatch("decode", batch=8, context=4096))
    assert rows["L0.q_proj"].cost.intensity == pytest.approx(8.0, rel=0.01)
    assert rows["L0.q_proj"].bound == "compute"


def test_prefill_gemms_are_far_above_the_ridge():
    rows, result = rows_by_node("llama-3.1-8b", MicroBatch("prefill", tokens=4096))
    ridge = result["ridge_flop_per_byte"]
    assert ridge == pytest.approx(1.0)  # 16 FLOP per cycle over 16 bytes read per cycle
    for op in ("q_proj", "k_proj", "o_proj", "gate_proj", "down_proj"):
        assert rows[f"L0.{op}"].cost.intensity > 500 * ridge
        assert rows[f"L0.{op}"].bound == "compute"
    # Only the last position goes through the LM head in a prefill.
    assert rows["lm_head"].cost.flops == 2 * 4096 * 128256


def test_grouped_query_attention_reuses_kv():
    model = load_model("llama-3.1-8b")
    work = MicroBatch("decode", batch=1, context=1000)
    c = op_cost(ops_by_name(model)["attn_scores"], model, work)
    assert c.flops == 2 * 128 * 32 * 1000
    assert c.kv_read_bytes == 1000 * 8 * 128 * 2
    # Four query heads share each KV head: about 4 FLOP per KV byte.
    assert c.flops / c.kv_read_bytes == pytest.approx(4.0)


def test_causal_prefill_attention_counts_the_triangle():
    model = load_model("tiny")
    c = op_cost(ops_by_name(model)["attn_scores"], model, MicroBatch("prefill", tokens=10))
    assert c.flops == 2 * model.attention.head_dim * model.attention.num_heads * 55


def test_sliding_window_caps_decode_context():
    model = load_model("tiny")
    windowed = model.replaced(sliding_window=64)
    full = op_cost(ops_by_name(model)["attn_scores"], model,
                   MicroBatch("decode", batch=2, context=500))
    capped = op_cost(ops_by_name(windowed)["attn_scores"], windowed,
                     MicroBatch("decode", batch=2, context=500))
    assert capped.flops * 500 == full.flops * 64


def test_qwen_biases_are_counted():
    rows, _ = rows_by_node("qwen2.5-7b", MicroBatch("decode", batch=1, context=16))
    q = rows["L0.q_proj"].cost
    assert q.weight_bytes == (3584 * 3584 + 3584) * 2
