"""A draft compiled beside its target (``compiler.draft``): the strip it takes, what it costs
the target, read back whole, and what it does not go with refused by name."""

import numpy as np
import pytest
import yaml

from wse_emu import api
from wse_emu.cli.main import main
from wse_emu.errors import CompileError, UserError
from wse_emu.program.format import WaferProgram


@pytest.fixture(scope="module")
def drafted():
    return api.compile("tiny", "mesh16", draft="mtp")


def test_the_draft_takes_a_strip_and_the_target_the_rest(drafted):
    plain = api.compile("tiny", "mesh16")
    d = drafted.summary["draft"]
    side = drafted.draft
    assert d["model"] == "tiny-mtp" and side.model.num_layers == 1
    assert side.fabric.width == d["strip_columns"] and side.fabric.height == 16
    target = drafted.regions[0].parts[0]
    assert target.w == 16 - d["strip_columns"] == 16 - drafted.options.reserved_columns
    # The strip's columns stay free in the target's program.
    assert (drafted.arrays["stage_id"][:, :, target.w:] == -1).all()
    assert d["strips"] == 1
    # Room for every token the target holds, and the target holds fewer than alone (one
    # replica beside its draft, where alone it lays out as many as fit).
    assert side.regions[0].kv_capacity_tokens >= drafted.regions[0].kv_capacity_tokens
    assert drafted.regions[0].kv_capacity_tokens < sum(r.kv_capacity_tokens
                                                       for r in plain.regions)
    assert d["sram_bytes"] == int(side.sram_total().sum()) > d["weight_bytes"] > 0


def test_an_mtp_head_uses_the_targets_embedding_and_lm_head(drafted):
    """As published heads do: its strip holds its decoder layer alone, and what it takes is
    that layer's weights."""
    side = drafted.draft
    stages = [side.stages[i] for i in side.regions[0].stage_ids]
    assert not any(s.has_embedding or s.has_head for s in stages)
    kernels = {k.name for s in stages for k in side.stage_kernels(s)}
    assert not kernels & {"embedding", "final_norm", "lm_head"}
    d = drafted.summary["draft"]
    assert d["shares_target_ends"]
    layer = round(side.model.layer_weight_bytes())
    assert d["weight_bytes"] == layer < side.model.weight_bytes()
    assert int(side.arrays["sram_weights"].astype(np.int64).sum()) == layer


def test_a_program_without_its_ends_is_the_compilers_own():
    with pytest.raises(UserError, match="`ends_shared` is the compiler's own"):
        api.compile("tiny", "mesh16", ends_shared=True)


def test_a_model_draft_lays_out_its_own_embedding_and_lm_head():
    drafted = api.compile("tiny", "mesh16", draft="tiny")
    side = drafted.draft
    stages = [side.stages[i] for i in side.regions[0].stage_ids]
    assert stages[0].has_embedding and stages[-1].has_head
    d = drafted.summary["draft"]
    assert not d["shares_target_ends"] and d["weight_bytes"] == side.model.weight_bytes()


def test_the_strip_is_the_narrowest_that_holds_the_draft(drafted):
    """One column fewer and the draft's KV room falls short of the target's (or the draft
    does not map)."""
    from wse_emu.compiler.draft import _enough, _pair
    from wse_emu.compiler.mapper import compile_model
    from wse_emu.hardware.fabric import ClusterSpec, load_fabric
    from wse_emu.program.options import CompileOptions

    width = drafted.summary["draft"]["strip_columns"]
    narrower = _pair(drafted.model, drafted.draft.model, ClusterSpec(load_fabric("mesh16"), 1),
                     CompileOptions(draft="mtp"), width - 1, compile_model)
    assert not _enough(narrower)


def test_a_program_with_a_draft_reads_back_whole(drafted, tmp_path):
    drafted.save(tmp_path)
    back = WaferProgram.load(tmp_path)
    assert back.to_json() == drafted.to_json()
    assert back.draft.to_json() == drafted.draft.to_json()
    assert all(np.array_equal(back.draft.arrays[k], v) for k, v in drafted.draft.arrays.items())
    assert back.arrays.keys() == drafted.arrays.keys()


def test_a_program_without_a_draft_writes_as_before(tmp_path):
    program = api.compile("tiny", "mesh16")
    assert "draft" not in program.to_json() and program.draft is None


def test_a_wider_strip_asked_for_takes_columns_from_the_target(drafted, tmp_path, capsys):
    width = drafted.summary["draft"]["strip_columns"]
    wider = api.compile("tiny", "mesh16", draft="mtp", draft_columns=width + 2)
    d = wider.summary["draft"]
    assert d["strip_columns"] == width + 2 and wider.options.draft_columns == width + 2
    assert d["kv_capacity_tokens"] > drafted.summary["draft"]["kv_capacity_tokens"]
    assert wider.regions[0].kv_capacity_tokens < drafted.regions[0].kv_capacity_tokens
    assert max(r.parts[0].x1 for r in wider.regions) + width + 2 == 16
    wider.save(tmp_path)
    assert WaferProgram.load(tmp_path).options.draft_columns == width + 2
    # Too narrow: refused, saying what it lacks or why the draft does not map there.
    with pytest.raises(CompileError, match=r"strip of 1 columns \(`draft_columns`\)"):
        api.compile("tiny", "mesh16", draft="mtp", draft_columns=1)
    assert main(["compile", "tiny", "--fabric", "mesh16", "--draft", "mtp",
                 "--draft-columns", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--draft-columns" in err[0]


@pytest.mark.parametrize("options, message", [
    ({"draft": "llama-3.2-1b"}, "must share one"),
    ({"draft": " "}, "`draft` is empty"),
    ({"draft_columns": 4}, "give a `draft` too"),
    ({"draft": "mtp", "draft_columns": 0}, "`draft_columns` must be at least 1"),
    ({"draft": "mtp", "draft_columns": 9}, "at most half of mesh16's 16 columns"),
])
def test_what_a_draft_does_not_go_with(options, message):
    with pytest.raises(UserError, match=message):
        api.compile("tiny", "mesh16", **options)


def test_a_split_shares_each_wafers_strip():
    """Disaggregated by columns: the prefill and the decode region of a wafer beside one
    strip, whose KV room covers both."""
    split = api.compile("tiny", "mesh16", plan="disaggregated", draft="mtp")
    roles = sorted(r.role for r in split.regions)
    assert roles == ["decode", "prefill"]
    held = sum(r.kv_capacity_tokens for r in split.regions)
    assert split.summary["draft"]["target_kv_capacity_tokens"] == held
    assert split.draft.regions[0].kv_capacity_tokens >= held
    assert max(r.parts[0].x1 for r in split.regions) + \
        split.summary["draft"]["strip_columns"] == 16


def test_a_draft_that_does_not_fit_says_how_much_sram_it_lacks(tmp_path, capsys):
    big = yaml.safe_load(open_preset("tiny"))
    big.update(name="big-draft", hidden_size=1024, intermediate_size=4096, num_layers=8,
               num_heads=16, num_kv_heads=4, head_dim=64)
    path = tmp_path / "big.yaml"
    path.write_text(yaml.safe_dump(big))
    with pytest.raises(CompileError, match=r"does not fit beside tiny .* it lacks [0-9.]+ GB"):
        api.compile("tiny", "mesh16", draft=str(path))
    assert main(["compile", "tiny", "--fabric", "mesh16", "--draft", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "lacks" in err[0]


def open_preset(name: str) -> str:
    from wse_emu.util.configfile import preset_dir

    return (preset_dir("models") / f"{name}.yaml").read_text()


def test_a_target_that_does_not_fit_beside_the_strip_says_so():
    with pytest.raises(CompileError, match="tiny does not map on the columns of mesh16 left"):
        api.compile("tiny", "mesh16", draft="mtp", region=(16, 16))


def test_the_program_says_it_was_compiled_with_its_draft(drafted):
    assert drafted.options.draft == "mtp"


def test_a_replica_over_wafers_has_the_strip_on_its_last_wafer_only():
    """A target that spans wafers: its last wafer gives the draft a strip, the others stay
    whole (a strip on each would cost the target more of its KV room), in both plans."""
    import dataclasses

    from wse_emu.compiler.mapper import compile_model
    from wse_emu.hardware.fabric import ClusterSpec, load_fabric
    from wse_emu.models.load import load_model
    from wse_emu.program.options import CompileOptions

    model = load_model("tiny").replaced(name="two-wafer", hidden_size=128,
                                        intermediate_size=256, num_layers=8,
                                        num_heads=8).validate("test")
    fabric = dataclasses.replace(load_fabric("mesh16"), sram_bytes_per_pe=12288)
    plain = compile_model(model, ClusterSpec(fabric, 4), CompileOptions())
    for options in (CompileOptions(draft="mtp"),
                    CompileOptions(draft="mtp", plan="disaggregated", prefill_systems=2)):
        drafted = compile_model(model, ClusterSpec(fabric, 4), options)
        width = drafted.summary["draft"]["strip_columns"]
        assert len(drafted.regions) == len(plain.regions) == 2
        for region in drafted.regions:
            first, last = region.parts
            assert (first.w, last.w) == (16, 16 - width)
            assert drafted.draft.regions[0].kv_capacity_tokens >= region.kv_capacity_tokens
        assert drafted.summary["draft"]["strips"] == 2


def test_a_target_that_misses_beside_the_narrowest_strip_is_tried_beside_wider_ones(drafted):
    """At the brim a target can miss beside the narrowest strip and map beside one a column
    wider (Llama-3.1-70B's split on four WSE-3 does): the next widths are tried."""
    from wse_emu.compiler.draft import compile_with_draft
    from wse_emu.compiler.mapper import compile_model
    from wse_emu.hardware.fabric import ClusterSpec, load_fabric
    from wse_emu.program.options import CompileOptions

    cluster = ClusterSpec(load_fabric("mesh16"), 1)
    side = drafted.draft.model
    narrowest = -(-round(side.layer_weight_bytes())
                  // (cluster.fabric.height * cluster.fabric.usable_bytes_per_pe))

    def crowded_at_the_narrowest(model, cl, options):
        if model.name == drafted.model.name and options.reserved_columns == narrowest:
            raise CompileError("activation buffers do not fit beside the weights")
        return compile_model(model, cl, options)

    program = compile_with_draft(drafted.model, cluster, CompileOptions(draft="mtp"),
                                 crowded_at_the_narrowest)
    assert program.summary["draft"]["strip_columns"] > narrowest
