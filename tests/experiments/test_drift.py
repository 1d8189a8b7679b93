"""The drift experiment: both plans tuned on one workload, served unchanged on others and
tuned afresh there."""

import json
from dataclasses import replace

import pytest
from helpers import FIXTURES, SMALL_CHAT, assert_one_line_error, run_cli

from wse_emu import api
from wse_emu.cli.experiment_cmd import render_drift
from wse_emu.errors import UserError
from wse_emu.experiments.drift import DriftReport, relayout_seconds
from wse_emu.hardware.fabric import load_fabric
from wse_emu.models.load import load_model
from wse_emu.pools.kinds.wafer import WaferRegion
from wse_emu.serving.pools import StagePool

SMALL_LONG, SMALL_MIX = FIXTURES / "small_long.yaml", FIXTURES / "small_mix.yaml"
SPACE = api.Space(copies=(1,), window_s=0.0, layers_per_stage="own", prefill_tile=(64,),
                  batch_limit=(64,), grid="quick")


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    return api.drift(api.DriftSpec(
        "tiny", api.Load(str(SMALL_CHAT), seeds=2), api.Targets(1.0, 0.01),
        (str(SMALL_LONG), str(SMALL_MIX)), api.Hardware("mesh16"), SPACE,
        api.Execution(workers=1, cache_dir=tmp_path_factory.mktemp("cache"))))


def test_the_choices_tuned_on_the_first_workload_are_served_unchanged_on_every_other(report):
    assert [r.workload for r in report.rows] == ["small-chat", "small-long", "small-mix"]
    assert report.tuned_on == "small-chat" and report.cluster == "1 x mesh16"
    first = report.rows[0]
    assert all(r.fixed == first.fixed and r.draws == 2 for r in report.rows)
    # On the workload they were tuned on, kept and retuned are one choice: no regret, and
    # the ratio is the experiment's own.
    assert first.retuned == first.fixed
    assert first.regret["colocated"]["values"] == first.regret["disaggregated"]["values"] \
        == [0.0, 0.0]
    own = report.experiments[0].over_replicates["goodput_ratio"]
    assert first.fixed_ratio["values"] == pytest.approx(own["values"])
    for row, data in zip(report.rows, report.experiments):
        assert row.workload == data.workload
        for plan in ("colocated", "disaggregated"):
            # Retuning keeps the better of its own choice and the one kept, draw by draw.
            assert all(0.0 <= v <= 1.0 for v in row.regret[plan]["values"])
            assert row.retuned_tokens_per_s_per_system[plan] > 0
        assert row.relayout_s is None or row.relayout_s > 0


def test_its_report_reads_back_and_renders(report):
    written = json.loads(json.dumps(report.to_json()))
    assert DriftReport.from_json(written).to_json() == written
    text = render_drift(report)
    assert "both plans tuned on small-chat" in text and "small-mix" in text


def test_relaying_a_split_out_loads_each_copy_over_the_links_in_parallel():
    model, wse3 = load_model("llama-3.1-8b"), load_fabric("wse3")
    def region(system):
        return replace(WaferRegion("r", "decode", 1, None, None, system=system),
                       link_bytes_per_cycle=wse3.offwafer_bytes_per_cycle())
    # Two copies on one wafer load one after another over its link; on two wafers, at once.
    one = relayout_seconds(model, [region(0), region(0)], wse3.clock_hz)
    assert one == pytest.approx(2 * model.weight_bytes() / wse3.offwafer_bytes_per_s)
    assert relayout_seconds(model, [region(0), region(1)], wse3.clock_hz) \
        == pytest.approx(one / 2)
    # Only wafers are laid out: an accelerator's pool reloads from its own host.
    assert relayout_seconds(model, [StagePool("a", "prefill", 1, None, None)], 1e9) is None


def test_a_served_on_workload_that_is_the_tuned_on_one_or_unknown_is_refused(tmp_path):
    with pytest.raises(UserError, match="the workload both plans are tuned on"):
        api.DriftSpec("tiny", api.Load(str(SMALL_CHAT)), api.Targets(1.0, 0.01),
                      (str(SMALL_CHAT),))
    with pytest.raises(UserError, match="must name one or more workloads"):
        api.DriftSpec("tiny", api.Load(str(SMALL_CHAT)), api.Targets(1.0, 0.01), ())
    proc = run_cli("experiment", "drift", "tiny", "--fabric", "mesh16", "--workload",
                   SMALL_CHAT, "--served-on", "no-such-workload", "--ttft-slo", "1",
                   "--tpot-slo", "0.01", "--cache-dir", tmp_path)
    assert_one_line_error(proc, "no-such-workload")


def test_its_run_directory_is_read_back_and_drawn(report, tmp_path):
    from wse_emu.rundir.directory import write_run_dir
    from wse_emu.rundir.write import write_json
    from wse_emu.visualize.rundraw import draw_run

    out = tmp_path / "run"
    write_run_dir(out, lambda tmp: write_json(tmp, "experiment.json", report.to_json()))
    page = draw_run(out, ("experiment",))
    assert (out / "figures" / "drift.png").is_file()
    assert "tuned on" in page.read_text() and "small-mix" in page.read_text()
