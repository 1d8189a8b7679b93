"""wse-emu validate: each fast check in its band (a change that moves one out fails here), the
slow ones in the slow tier; a check out of band makes the command exit 1; the accuracy page is
the command's own output."""

import json
import re
from pathlib import Path

import pytest

from wse_emu.cli.main import main
from wse_emu.validation import catalog
from wse_emu.validation.checks import FAST, NOT_RUN, SLOW, Check, Reference, run_check

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "accuracy.md"


@pytest.fixture(scope="module")
def fast_outcomes() -> dict:
    """Every fast check, run once for the tests below."""
    return {c.name: run_check(c) for c in catalog.CHECKS if c.speed == FAST}


@pytest.mark.parametrize("name", [c.name for c in catalog.CHECKS if c.speed == FAST])
def test_a_fast_check_is_in_its_band(fast_outcomes, name):
    outcome = fast_outcomes[name]
    if outcome.status == NOT_RUN:
        pytest.skip(outcome.why_not_run)
    assert outcome.status == "pass", (outcome.ours, outcome.ratio, outcome.check.band)


@pytest.mark.slow
@pytest.mark.parametrize("check", [c for c in catalog.CHECKS if c.speed == SLOW],
                         ids=lambda c: c.name)
def test_a_slow_check_is_in_its_band(check):
    outcome = run_check(check)
    if outcome.status == NOT_RUN:
        pytest.skip(outcome.why_not_run)
    assert outcome.status == "pass", (outcome.ours, outcome.ratio, check.band)


def test_every_check_names_its_source_and_a_band_with_its_reason():
    for c in catalog.CHECKS:
        assert c.reference.source and c.reference.measured and c.reference.value > 0
        assert 0 < c.band[0] <= c.band[1] and c.why_band and c.ours


def out_of_band() -> Check:
    return Check("out of band, for the test", Reference("a test", "today", "two", 2.0, "x"),
                 "one", (0.9, 1.1), "one is not two", FAST, lambda: 1.0)


def test_a_check_out_of_band_exits_1_and_is_named(monkeypatch, capsys):
    monkeypatch.setattr(catalog, "CHECKS", [out_of_band()])
    assert main(["validate", "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["failed"] == ["out of band, for the test"]
    assert data["checks"][0]["ratio"] == 0.5 and data["checks"][0]["status"] == "fail"
    assert main(["validate"]) == 1
    assert "out of band: out of band, for the test" in capsys.readouterr().out


def test_a_name_no_check_holds_is_one_line_and_exit_2(capsys):
    assert main(["validate", "--only", "no such check"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no check matches 'no such check'" in err[0]


def test_the_accuracy_page_lists_every_check_and_the_fast_figures_as_computed(fast_outcomes):
    """The page is `validate --page`'s output: every check in it, in order, and each fast
    check's figure as the code gives it now (the slow tier compares the whole page)."""
    page = PAGE.read_text()
    rows = re.findall(r"^\| (.+?) \| .+? \| (.+?) \| (.+?) \| .+? \| ([\w ]+) \| (\w+) \|$",
                      page, re.M)[1:]  # (the header row first)
    assert [r[0] for r in rows] == [c.name for c in catalog.CHECKS]
    for name, ours, ratio, verdict, speed in rows:
        if name in fast_outcomes and fast_outcomes[name].status != NOT_RUN:
            assert ratio == f"{fast_outcomes[name].ratio:.3f}", name
            assert verdict == "pass" and speed == FAST


@pytest.mark.slow
def test_the_accuracy_page_is_the_commands_output(capsys):
    """The whole page, but the rows of checks whose extra is not installed here (the page
    shows them as they ran where it was written)."""
    assert main(["validate", "--page"]) == 0
    unrunnable = [c.name for c in catalog.CHECKS if c.missing()]

    def runnable(text: str) -> list[str]:
        return [line for line in text.splitlines()
                if not any(line.startswith(f"| {name} |") for name in unrunnable)]
    assert runnable(capsys.readouterr().out) == runnable(PAGE.read_text())


def test_a_check_whose_extra_is_missing_is_not_run_and_says_which(monkeypatch, capsys):
    needing = Check("needs an extra, for the test", Reference("a test", "today", "two", 2.0,
                                                              "x"), "two", (0.9, 1.1),
                    "two is two", FAST, lambda: 2.0, extra="nothing",
                    needs=("no_such_module_anywhere",))
    monkeypatch.setattr(catalog, "CHECKS", [needing, out_of_band()])
    assert main(["validate", "--json"]) == 1  # the other check fails; this one does not
    data = json.loads(capsys.readouterr().out)
    assert data["failed"] == ["out of band, for the test"]
    first = data["checks"][0]
    assert first["status"] == "not run" and first["ours"]["value"] is None
    assert first["why_not_run"] == "needs the nothing extra: pip install -e '.[nothing]'"
    monkeypatch.setattr(catalog, "CHECKS", [needing])
    assert main(["validate"]) == 0
    out = capsys.readouterr().out
    assert "0 passed, 0 failed, 1 not run" in out and "needs the nothing extra" in out


def test_the_measured_trn2_preset_holds_the_efficiencies_its_derivation_gives():
    """trn2-measured's efficiencies are what the roofline needs to give AWS's measured TTFT
    and ITL of Llama-3.3-70B (to the three digits the file keeps), and nothing else in it
    differs from trn2."""
    from dataclasses import replace

    from wse_emu.hardware.accelerator import load_accelerator
    from wse_emu.validation.trn2 import LLAMA_70B, fitted, predicted

    measured, roofline = load_accelerator("trn2-measured"), load_accelerator("trn2")
    matrix, memory = fitted(LLAMA_70B)
    assert measured.matrix_efficiency == pytest.approx(matrix, abs=5e-4)
    assert measured.memory_efficiency == pytest.approx(memory, abs=5e-4)
    assert replace(measured, name="trn2", description=roofline.description,
                   matrix_efficiency=1.0, memory_efficiency=1.0) == roofline
    assert predicted(LLAMA_70B, 0, (matrix, memory)) == pytest.approx(LLAMA_70B.ttft_s)
    assert predicted(LLAMA_70B, 1, (matrix, memory)) == pytest.approx(LLAMA_70B.itl_s)


def test_the_logits_check_fails_when_ours_depart_from_transformers(monkeypatch):
    """Where transformers is installed: logits one part in a thousand off leave the band, and
    a token chosen differently scores 0."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers", minversion="5.0")
    from dataclasses import replace

    from wse_emu.validation import logits

    real = logits.generate

    def off_by(scale, swap=False):
        def generate(*args, **kwargs):
            out = real(*args, **kwargs)
            ids = list(out.generated_ids)
            if swap:
                ids[-1] = (ids[-1] + 1) % 256
            return replace(out, logits=out.logits * scale, generated_ids=ids)
        return generate
    monkeypatch.setattr(logits, "generate", off_by(1.001))
    assert logits.agreement() < logits.CHECKS[0].band[0]
    monkeypatch.setattr(logits, "generate", off_by(1.0, swap=True))
    assert logits.agreement() == 0.0
