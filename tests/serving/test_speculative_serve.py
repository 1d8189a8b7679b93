"""Serving with speculative decoding on a wafer with its draft beside the target: through the
API and the command line, on both loops alike, never faster per user at acceptance 0 than
without speculation, and refused by name where it cannot run."""

import json

import numpy as np
import pytest
from helpers import SMALL_CHAT

from wse_emu import api
from wse_emu.cli.main import main
from wse_emu.errors import UserError
from wse_emu.serving.speculation import tokens_per_step


@pytest.fixture(scope="module")
def drafted():
    return api.compile("tiny", "mesh16", draft="mtp")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("speculative-tables")


def served(program, cache, **options):
    return api.serve(program, SMALL_CHAT, cache_dir=cache, **options)


def test_the_report_says_what_speculation_did(drafted, cache):
    run = served(drafted, cache, draft_tokens=3, acceptance=0.7)
    spec = run.report.to_json()["speculation"]
    assert spec["draft"] == "tiny-mtp" and spec["draft_tokens"] == 3
    assert spec["tokens_per_step_expected"] == pytest.approx(tokens_per_step(3, 0.7))
    assert 1 < spec["tokens_per_step"] <= 4
    assert sum(spec["tokens_per_step_share"].values()) == pytest.approx(1)
    alone = spec["step_alone"]
    assert alone["draft_s"] > 0 and alone["verify_s"] > 0 and 0 < alone["draft_share"] < 1
    # Over the run, the draft's stages hold a share of the decode stage-time (its K steps per
    # micro-batch against the target's verify steps).
    assert list(spec["draft_share_of_decode"]) == ["mixed0"]
    assert 0 < spec["draft_share_of_decode"]["mixed0"] < 1
    assert run.result.regions["mixed0"]["draft_share_of_decode"] == \
        spec["draft_share_of_decode"]["mixed0"]
    assert spec["draft_sram_bytes"] == drafted.summary["draft"]["sram_bytes"]
    assert np.array_equal(run.result.tokens, run.requests.output_tokens)


def test_both_loops_give_the_same_times(drafted, cache):
    compiled = served(drafted, cache, draft_tokens=2, acceptance=0.8)
    plain = served(drafted, cache, draft_tokens=2, acceptance=0.8, loop="plain")
    for name in ("first_token", "finish", "gap_cycles", "gap_request"):
        assert np.array_equal(getattr(compiled.result, name), getattr(plain.result, name)), name
    assert compiled.report.to_json() == plain.report.to_json()


def test_acceptance_zero_is_never_faster_per_user(drafted, cache):
    """Against the same target laid out alike, without a draft beside it."""
    width = drafted.regions[0].parts[0].w  # the columns the draft's strip leaves
    alone = served(api.compile("tiny", "mesh16", region=(width, 16)), cache)
    rejected = served(drafted, cache, draft_tokens=2, acceptance=0.0)
    a, b = alone.metrics, rejected.metrics
    assert b.user_tokens_per_s.p50 <= a.user_tokens_per_s.p50
    assert b.user_tokens_per_s.mean <= a.user_tokens_per_s.mean
    assert b.tpot_s.p50 >= a.tpot_s.p50


def test_accepting_everything_yields_k_plus_one_per_step(drafted, cache):
    run = served(drafted, cache, draft_tokens=2, acceptance=1.0)
    shares = run.report.speculation["tokens_per_step_share"]
    # Only a request's last step may yield fewer (its output ends).
    assert shares["3"] > 0.5 and run.report.speculation["tokens_per_step_expected"] == 3


def test_the_same_seed_gives_the_same_run_and_another_another(drafted, cache):
    one = served(drafted, cache, draft_tokens=2, acceptance=0.5, acceptance_seed=1)
    again = served(drafted, cache, draft_tokens=2, acceptance=0.5, acceptance_seed=1)
    other = served(drafted, cache, draft_tokens=2, acceptance=0.5, acceptance_seed=2)
    assert one.report.to_json() == again.report.to_json()
    assert not np.array_equal(one.result.finish, other.result.finish)


@pytest.mark.parametrize("options, message", [
    ({"draft_tokens": 2}, "`draft_tokens` and `acceptance` together"),
    ({"acceptance": 0.5}, "give `draft_tokens` too"),
    ({"acceptance_seed": 3}, "give `draft_tokens` too"),
    ({"draft_tokens": 2, "acceptance": 1.5}, "`acceptance` must be a probability"),
    ({"draft_tokens": 17, "acceptance": 0.5}, "at most 16"),
])
def test_bad_speculation_is_refused_by_name(drafted, cache, options, message):
    with pytest.raises(UserError, match=message):
        served(drafted, cache, **options)


def test_speculation_needs_a_draft(cache):
    with pytest.raises(UserError, match="needs a draft beside the target"):
        served(api.compile("tiny", "mesh16"), cache, draft_tokens=2, acceptance=0.5)


def test_a_draft_is_not_left_idle(drafted, cache):
    with pytest.raises(UserError, match="has a draft .* beside the target"):
        served(drafted, cache)


def test_the_command_line_serves_with_a_draft(capsys, cache):
    argv = ["--quiet", "serve", "tiny", "--fabric", "mesh16", "--workload", str(SMALL_CHAT),
            "--draft", "mtp", "--draft-tokens", "2", "--acceptance", "0.6", "--cache-dir",
            str(cache)]
    assert main([*argv, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["speculation"]["draft_tokens"] == 2
    assert main(argv) == 0
    assert "tokens per verify step" in capsys.readouterr().out


def test_an_acceptance_table_from_the_command_line(capsys, cache, tmp_path):
    table = tmp_path / "acc.csv"
    table.write_text("draft_tokens,mean_tokens_per_step\n2,2.4\n")
    argv = ["--quiet", "serve", "tiny", "--fabric", "mesh16", "--workload", str(SMALL_CHAT),
            "--draft", "mtp", "--draft-tokens", "2", "--acceptance", str(table),
            "--cache-dir", str(cache), "--json"]
    assert main(argv) == 0
    spec = json.loads(capsys.readouterr().out)["speculation"]
    assert spec["tokens_per_step_expected"] == pytest.approx(2.4)


@pytest.mark.parametrize("extra, message", [
    (["--draft-tokens", "2"], "together"),
    (["--draft-tokens", "2", "--acceptance", "0.5"], "needs a draft"),
    (["--draft", "mtp"], "give --draft-tokens and --acceptance"),
    (["--draft-tokens", "2", "--acceptance", "missing.csv", "--draft", "mtp"],
     "cannot read the acceptance table"),
])
def test_the_command_line_refuses_in_one_line(capsys, cache, extra, message):
    argv = ["serve", "tiny", "--fabric", "mesh16", "--workload", str(SMALL_CHAT),
            "--cache-dir", str(cache), *extra]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_a_split_speculates_on_its_decode_side(cache):
    """Disaggregated: the decode region drafts and verifies, the prefill region fills the
    draft's KV from each prompt, and the handoff carries both KVs; both loops alike."""
    split = api.compile("tiny", "mesh16", plan="disaggregated", draft="mtp")
    compiled = served(split, cache, draft_tokens=2, acceptance=0.7)
    plain = served(split, cache, draft_tokens=2, acceptance=0.7, loop="plain")
    assert compiled.report.to_json() == plain.report.to_json()
    assert compiled.report.speculation["tokens_per_step"] > 1
    # The prefill side's pipeline starts with the draft's stages, which fill its KV from
    # each prompt; it verifies nothing.
    from wse_emu.pools.kinds.wafer import wafer_pools

    drafts = len(split.draft.regions[0].stage_ids)
    pools = wafer_pools(split, cache, draft_tokens=2)
    prefill = next(p for p in pools if p.role == "prefill")
    assert prefill.stages == drafts + len(split.region(prefill.name).stage_ids)
    assert prefill.verify is None and prefill.prefill.cycles[:drafts].min() > 0


def test_the_draft_takes_more_of_decode_the_more_it_drafts(drafted, cache):
    shares = [served(drafted, cache, draft_tokens=k, acceptance=0.7).report.to_json()
              ["speculation"]["draft_share_of_decode"]["mixed0"] for k in (1, 4)]
    assert 0 < shares[0] < shares[1] < 1


def test_an_mtp_heads_steps_keep_the_targets_embedding_and_lm_head_busy(drafted, cache):
    """Each drafted token runs the target's embedding and LM-head kernels once more: the
    speculating pool's decode table holds K such passes in the target's stages that hold them,
    each kernel timed by the engine alone, and its reference step counts them as the draft's."""
    from wse_emu.models.layer import MicroBatch
    from wse_emu.pools.kinds.wafer import wafer_pools
    from wse_emu.pools.speculative import step_alone
    from wse_emu.sim.shared_ends import ends_cycles

    k = 3
    alone = wafer_pools(drafted, cache)[0]
    spec = wafer_pools(drafted, cache, draft_tokens=k)[0]
    ends, drafts = spec.draft_ends, spec.draft_stages
    assert ends is not None and drafts == len(drafted.draft.regions[0].stage_ids)
    stages = [drafted.stages[i] for i in drafted.regions[0].stage_ids]
    for i, batch in enumerate(ends.axis0):
        step = MicroBatch("decode", batch=int(batch), context=int(ends.axis1[0]))
        timed = [ends_cycles(drafted, s, step, "fast") for s in stages]
        assert list(ends.cycles[:, i, 0]) == timed
        assert timed[0] > 0 and timed[-1] > 0  # the embedding's stage, the LM head's
        np.testing.assert_allclose(spec.decode.cycles[drafts:, i],
                                   alone.decode.cycles[:, i] + k * ends.cycles[:, i, :])
        # The drafted tokens' trips between the strip and them, on top of the target's.
        assert ends.transfers[i, 0] > 0
        assert (spec.decode.transfers[i] >= alone.decode.transfers[i]
                + k * ends.transfers[i, 0]).all()
    # Without the passes, the draft's share of the reference step would be smaller.
    with_ends = step_alone(spec, drafts, 1.0)
    spec.draft_ends = None
    without = step_alone(spec, drafts, 1.0)
    assert with_ends["draft_s"] > without["draft_s"]
    assert with_ends["draft_s"] + with_ends["verify_s"] == \
        pytest.approx(without["draft_s"] + without["verify_s"])
