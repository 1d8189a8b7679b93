"""GPU pools from AIConfigurator's measured databases (the `gpu` extra): the step times and KV
capacity the database gives, in serving cycles; the tensor-parallel degree the weights need;
a GPU prefill feeding an accelerator's decode; refused by name without the extra."""

import pytest

from wse_emu import api
from wse_emu.errors import UserError
from wse_emu.models.load import load_model
from wse_emu.pools.kinds import gpu as gpu_pool
from wse_emu.serving.tables import SERVER_AXES

CLOCK_HZ = 1e9


def test_without_the_extra_a_gpu_pool_is_refused_by_name(monkeypatch):
    monkeypatch.setattr(gpu_pool, "gpu_available", lambda: False)
    with pytest.raises(UserError, match=r"GPU pools need AIConfigurator's databases: "
                                        r"pip install -e '.\[gpu\]'"):
        gpu_pool.load_gpu("h200")


@pytest.fixture(scope="module")
def h200():
    pytest.importorskip("aiconfigurator_core")
    return gpu_pool.load_gpu("h200")


def test_the_tables_hold_the_databases_step_times_in_serving_cycles(h200):
    from aiconfigurator_core.sdk import EngineHandle

    model = load_model("llama-3.1-8b")
    pools = gpu_pool.gpu_pools(h200, model, "mixed", CLOCK_HZ, gpus=8)
    assert len(pools) == 8 and {p.system for p in pools} == {0}  # tp 1, one node of 8
    engine = EngineHandle.compile(gpu_pool.MODELS[model.name], h200.system, gpu_pool.BACKEND,
                                  tp_size=1, pp_size=1)
    tokens, prefixes = SERVER_AXES["prefill"]
    got = pools[0].prefill.cycles[0, 1, 1]  # a tile after a cached prefix
    assert got == pytest.approx(engine.predict_prefill_latency(
        1, prefixes[1] + tokens[1], prefixes[1]) * 1e-3 * CLOCK_HZ)
    batches, contexts = SERVER_AXES["decode"]
    assert pools[0].decode.cycles[0, 2, 1] == pytest.approx(
        engine.decode_step_latency(batches[2], contexts[1], 0) * 1e-3 * CLOCK_HZ)
    # The database's own KV estimate for one H200 holding the 16-bit 8B model.
    assert pools[0].kv_capacity_tokens == 898_416


def test_a_model_takes_the_fewest_gpus_whose_memory_its_weights_take_half_of(h200):
    assert gpu_pool.tensor_parallel(h200, load_model("llama-3.1-8b"), 8) == 1
    # 141 GB of 16-bit weights: more than half of one H200's 141 GiB, under half of two.
    assert gpu_pool.tensor_parallel(h200, load_model("llama-3.1-70b"), 8) == 2
    assert gpu_pool.tensor_parallel(h200, load_model("llama-3.1-70b"), 8, asked=4) == 4
    with pytest.raises(UserError, match="llama-3.1-70b does not fit 1 x h200"):
        gpu_pool.tensor_parallel(h200, load_model("llama-3.1-70b"), 1)
    with pytest.raises(UserError, match="tp must be a power of two"):
        gpu_pool.tensor_parallel(h200, load_model("llama-3.1-8b"), 8, asked=3)


def test_a_model_the_database_does_not_describe_is_refused_by_name(h200):
    with pytest.raises(UserError, match="GPU pools know the models of AIConfigurator"):
        gpu_pool.gpu_pools(h200, load_model("tiny"), "prefill", CLOCK_HZ, gpus=1)


def test_gpu_prefill_feeds_accelerator_decode(h200):
    served = api.serve_pools("llama-3.1-8b", "chat", sides={"prefill": "h200x8", "decode": "trn2"},
                             requests=200)
    result, metrics = served.result, served.metrics
    assert served.report.step_times.keys() == {"prefill step times", "decode step times"}
    roles = {name: r["role"] for name, r in result.regions.items()}
    assert {roles[n] for n in roles if n.startswith("h200")} == {"prefill"}
    assert {roles[n] for n in roles if n.startswith("trn2")} == {"decode"}
    assert metrics.requests == 200 and metrics.refused == 0
