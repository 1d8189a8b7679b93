"""The kinds of hardware a pool may be named by: each answers for its own names, files,
systems, power and layouts, and a name or a file no kind claims is refused by name."""

from pathlib import Path

import pytest
import yaml

from wse_emu.errors import UserError
from wse_emu.models.load import load_model
from wse_emu.pools.kinds import kind_of, kinds
from wse_emu.pools.kinds.base import PoolKind
from wse_emu.pools.kinds.gpu import gpu_available
from wse_emu.pools.names import parse_pool

FABRICS = Path(__file__).resolve().parents[2] / "programs" / "fabrics"
FACES = ("presets", "load", "owns", "power_w", "label", "pools", "step_times_source")


def test_every_kind_answers_for_its_whole_face():
    for kind in kinds():
        for face in FACES:
            assert getattr(type(kind), face) is not getattr(PoolKind, face), (kind.noun, face)
        assert kind.noun


def test_no_name_is_claimed_by_two_kinds():
    names = [n for k in kinds() for n in k.presets()]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("text, noun, systems", [("wse3x2", "a fabric", 2),
                                                 ("trn2x3", "an accelerator", 3)])
def test_a_name_finds_its_kind(text, noun, systems):
    name = parse_pool(text)
    assert name.kind.noun == noun and kind_of(name.hardware) is name.kind
    assert name.systems == systems


@pytest.mark.skipif(not gpu_available(), reason="needs the gpu extra")
def test_gpus_of_a_node_make_one_system():
    name = parse_pool("h200x12")
    assert name.kind.noun == "a GPU" and name.systems == 2  # 8 to a node: a part counts whole
    assert [s.tp for s in name.kind.variants(name, load_model("llama-3.1-8b"), (1,), ())] \
        == [1, 2, 4]


def test_only_gpus_name_their_gpus_per_copy():
    for text in ("wse3x2tp2", "trn2x2tp2"):
        with pytest.raises(UserError, match="tpK .* is for a GPU pools"):
            parse_pool(text)


def test_a_file_is_read_by_the_kind_it_describes(tmp_path):
    trn2 = parse_pool("trn2").hardware
    accel = tmp_path / "mine.yaml"
    accel.write_text(yaml.safe_dump({**trn2.to_dict(), "name": "mine"}))
    assert parse_pool(f"{accel}x2").kind.noun == "an accelerator"
    assert parse_pool(str(FABRICS / "mesh8.yaml")).kind.noun == "a fabric"


def test_a_file_no_kind_claims_is_read_as_a_fabric_that_says_what_it_lacks(tmp_path):
    other = tmp_path / "other.yaml"
    other.write_text("version: 1\nname: other\nspeed: 3\n")
    with pytest.raises(UserError, match="width"):
        parse_pool(str(other))


def test_an_unknown_name_lists_every_kind_and_the_files_they_read():
    with pytest.raises(UserError) as caught:
        parse_pool("tpu9x2")
    for kind in kinds():
        assert kind.noun in str(caught.value)
        assert kind.file_mark in str(caught.value)
    assert sum(k.default_file for k in kinds()) == 1
