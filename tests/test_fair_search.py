"""The colocated baseline gets the same tuning as disaggregation: copies of the model per
wafer and prefill tile sizes are searched, and the comparison takes the best of them."""

import json
from pathlib import Path

from wse_emu.cli.main import main

SMALL_CHAT = Path(__file__).parent / "data" / "small_chat.yaml"  # 40 chat requests


def run(tmp_path, capsys, *extra) -> dict:
    args = ["experiment", "disagg", "tiny", "--fabric", "mesh64", "--workload", str(SMALL_CHAT),
            "--ttft-slo", "0.05", "--tpot-slo", "0.001", "--budgets", "64", "--workers", "1",
            "--requests", "60", "--cache-dir", str(tmp_path / "cache"), "--json", *extra]
    assert main(args) == 0
    return json.loads(capsys.readouterr().out)


def test_the_search_takes_several_copies_per_wafer_when_they_serve_more(tmp_path, capsys):
    """A tiny model on a 64x64 mesh leaves one copy's pipeline mostly idle: four copies, each
    on a quarter of the columns, sustain a higher rate, and the comparison is made against
    them."""
    data = run(tmp_path, capsys, "--copies", "1,4")
    rates = {c["configuration"]: c["max_rate_per_s"] for c in data["configurations"]}
    one = max(r for label, r in rates.items()
              if label.startswith("colocated") and "copies" not in label)
    four = max(r for label, r in rates.items() if label.startswith("colocated, 4 copies"))
    assert four > one
    assert data["comparison"]["colocated"].startswith("colocated, 4 copies")


def test_every_tile_size_is_tried_and_copies_that_do_not_fit_are_skipped(tmp_path, capsys):
    data = run(tmp_path, capsys, "--prefill-tile", "16,64", "--copies", "1,65")
    labels = [c["configuration"] for c in data["configurations"]]
    for policy in ("colocated, prefill priority", "colocated, interleaved",
                   "disaggregated, share 0.5"):
        assert f"{policy}, tile 16" in labels and f"{policy}, tile 64" in labels
    assert "colocated, chunked 64" in labels  # chunked prefill sizes chunks by its budget
    assert any(s.startswith("colocated 65 copies") for s in data["skipped"])
