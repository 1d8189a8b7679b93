"""A program read back from a run directory, checked against its schema before it is used.

``program.json`` may have been written by another version, edited by hand, or damaged; its
digest (``WaferProgram.save``) catches a change since it was compiled, and this module catches
a structure the engines could not take: a field missing, of the wrong type or out of range, a
rectangle off the wafer, a stage or kernel id that points nowhere, an array of the wrong
shape. Each check raises ``ValueError`` naming the item and what is wrong; the loader turns it
into one line saying to recompile. The field types come from the dataclasses themselves, so a
field added to ``Stage`` is checked without a line here.
"""

from __future__ import annotations

from dataclasses import MISSING, fields
from typing import Any

from wse_emu.hardware.fabric import FabricSpec
from wse_emu.models import layer as ly
from wse_emu.models.spec import ModelSpec
from wse_emu.util.checks import short_repr

ROLES = ("prefill", "decode", "mixed")
KERNEL_KINDS = tuple(sorted(set(ly.KERNEL_KINDS.values())))
STRIP_AXES = ("x", "y")
K_AXES = ("", "x", "y")
ROOTS = ("", "east", "west", "south", "north")
ARRAYS = ("stage_id", "color_mask")  # beside one sram_<category> array per category


def check_program(data: dict, fabric: FabricSpec, model: ModelSpec, arrays: dict,
                  classes: dict, sram_categories: tuple[str, ...]) -> None:
    """Check a program's JSON ``data`` (fabric and model already read) and its ``arrays``.
    ``classes`` maps "regions", "stages", "kernels" and "routes" to their dataclasses."""
    systems = data.get("systems")
    _expect(_is_int(systems) and systems >= 1, "systems", "must be a whole number, at least 1")
    for name in ("options", "summary"):
        _expect(isinstance(data.get(name, {}), dict), name, "must be a mapping")
    items = {}
    for name, cls in classes.items():
        listed = data.get(name)
        _expect(isinstance(listed, list), name, "must be a list")
        for i, item in enumerate(listed):
            check_fields(f"{name}[{i}]", item, cls)
        items[name] = listed
    wafer = Wafer(systems, fabric.width, fabric.height)
    regions, stages, kernels, routes = (items[k] for k in ("regions", "stages", "kernels",
                                                           "routes"))
    _expect(bool(regions), "regions", "must list at least one region")
    _check_regions(regions, stages, wafer)
    _check_stages(stages, model, wafer)
    _check_kernels(kernels, stages, wafer)
    _check_routes(routes, kernels, stages, fabric, wafer)
    _check_arrays(arrays, len(stages), wafer, sram_categories)


class Wafer:
    """What a rectangle must fit within: ``systems`` wafers of ``width`` x ``height`` PEs."""

    def __init__(self, systems: int, width: int, height: int):
        self.systems, self.width, self.height = systems, width, height

    def check(self, where: str, rect: list) -> None:
        system, x, y, w, h = rect
        _expect(0 <= system < self.systems, where, f"system {system} is not one of the "
                f"program's {self.systems}")
        _expect(w >= 1 and h >= 1, where, f"a {w} x {h} rectangle is empty")
        _expect(0 <= x and x + w <= self.width and 0 <= y and y + h <= self.height, where,
                f"{w}x{h} at ({x},{y}) is off the {self.width} x {self.height} wafer")


def _check_regions(regions: list, stages: list, wafer: Wafer) -> None:
    names = [r["name"] for r in regions]
    _expect(len(set(names)) == len(names), "regions", "two regions share a name")
    owner = {}
    for i, r in enumerate(regions):
        where = f"regions[{i}]"
        _one_of(f"{where}.role", r["role"], ROLES)
        _expect(bool(r["parts"]), f"{where}.parts", "must list at least one rectangle")
        for j, part in enumerate(r["parts"]):
            wafer.check(f"{where}.parts[{j}]", part)
        for position, s in enumerate(r.get("stage_ids", [])):
            _index(f"{where}.stage_ids", s, stages)
            _expect(s not in owner, f"{where}.stage_ids", f"stage {s} is also in "
                    f"{owner.get(s)}")
            owner[s] = r["name"]
            _expect(stages[s]["region"] == r["name"], f"stages[{s}].region",
                    f"is {stages[s]['region']!r}, but region {r['name']!r} lists it")
            _expect(stages[s]["index"] == position, f"stages[{s}].index",
                    f"is {stages[s]['index']}, its place in region {r['name']!r} is {position}")
        _expect(r.get("kv_capacity_tokens", 0) >= 0, f"{where}.kv_capacity_tokens",
                "must not be negative")
    missing = sorted(set(range(len(stages))) - set(owner))
    _expect(not missing, "stages", f"stage {missing[:1]} belongs to no region")


def _check_stages(stages: list, model: ModelSpec, wafer: Wafer) -> None:
    for i, s in enumerate(stages):
        where = f"stages[{i}]"
        _expect(s["id"] == i, f"{where}.id", f"is {s['id']}, its place in the list is {i}")
        wafer.check(f"{where}.rect", s["rect"])
        _one_of(f"{where}.strip_axis", s["strip_axis"], STRIP_AXES)
        layers = s["layers"]
        _expect(len(layers) == 2 and 0 <= layers[0] <= layers[1] <= model.num_layers,
                f"{where}.layers", f"{layers} is not a range of {model.name}'s "
                f"{model.num_layers} layers")
        for name in ("kv_slots", "kv_capacity_tokens"):
            _expect(s.get(name, 0) >= 0, f"{where}.{name}", "must not be negative")
        experts = s.get("experts")
        if experts is not None:
            count = model.experts.count if model.is_moe else 0
            _expect(len(experts) == 2 and 0 <= experts[0] < experts[1] <= count,
                    f"{where}.experts", f"{experts} is not a range of {model.name}'s "
                    f"{count} experts")


def _check_kernels(kernels: list, stages: list, wafer: Wafer) -> None:
    for i, k in enumerate(kernels):
        where = f"kernels[{i}]"
        _expect(k["id"] == i, f"{where}.id", f"is {k['id']}, its place in the list is {i}")
        _one_of(f"{where}.kind", k["kind"], KERNEL_KINDS)
        _index(f"{where}.stage", k["stage"], stages)
        wafer.check(f"{where}.rect", k["rect"])
        stage = stages[k["stage"]]["rect"]
        _expect(_contains(stage, k["rect"]), f"{where}.rect", "lies outside its stage's "
                "rectangle")
        for name in ("matrix", "grid"):
            value = k.get(name)
            if value is not None:
                _expect(len(value) == 2 and min(value) >= 1, f"{where}.{name}",
                        "must be two counts of at least 1")
        _expect(k.get("length") is None or k["length"] >= 1, f"{where}.length",
                "must be at least 1")
        _expect(k["layers"] >= 0 and k.get("weight_bytes", 0) >= 0, where,
                "layers and weight_bytes must not be negative")
        if k.get("weight_ref") is not None:
            _index(f"{where}.weight_ref", k["weight_ref"], kernels)
        _one_of(f"{where}.k_axis", k.get("k_axis", ""), K_AXES)
        _one_of(f"{where}.root", k.get("root", ""), ROOTS)
        for name, levels in k.get("trees", {}).items():
            _expect(levels >= 0, f"{where}.trees.{name}", "must not be negative")
    for i, s in enumerate(stages):
        for k in s.get("kernel_ids", []):
            _index(f"stages[{i}].kernel_ids", k, kernels)
            _expect(kernels[k]["stage"] == i, f"kernels[{k}].stage",
                    f"is {kernels[k]['stage']}, but stage {i} lists it")


def _check_routes(routes: list, kernels: list, stages: list, fabric: FabricSpec,
                  wafer: Wafer) -> None:
    for i, r in enumerate(routes):
        where = f"routes[{i}]"
        _expect(r["id"] == i, f"{where}.id", f"is {r['id']}, its place in the list is {i}")
        wafer.check(f"{where}.footprint", r["footprint"])
        color = r.get("color", -1)
        _expect(-1 <= color < fabric.colors_available, f"{where}.color",
                f"{color} is not one of the fabric's {fabric.colors_available} colors")
        if r.get("src") is not None:
            _index(f"{where}.src", r["src"], kernels)
        for d in r.get("dst", []):
            _index(f"{where}.dst", d, kernels)
        if r.get("stage") is not None:
            _index(f"{where}.stage", r["stage"], stages)
        _expect(r.get("bytes_per_token", 0) >= 0 and r.get("hops", 0) >= 0, where,
                "bytes_per_token and hops must not be negative")


def _check_arrays(arrays: dict, n_stages: int, wafer: Wafer,
                  sram_categories: tuple[str, ...]) -> None:
    shape = (wafer.systems, wafer.height, wafer.width)
    for name in (*(f"sram_{c}" for c in sram_categories), *ARRAYS):
        _expect(name in arrays, "program.npz", f"has no array {name!r}")
        a = arrays[name]
        _expect(a.shape == shape and a.dtype.kind in "iu", f"program.npz: {name}",
                f"is {a.dtype} {a.shape}; the program's wafers need integers {shape}")
        if name.startswith("sram_"):
            _expect(a.size == 0 or int(a.min()) >= 0, f"program.npz: {name}",
                    "holds negative byte counts")
    ids = arrays["stage_id"]
    _expect(ids.size == 0 or (int(ids.min()) >= -1 and int(ids.max()) < n_stages),
            "program.npz: stage_id", f"names a stage the program does not have "
            f"(it has {n_stages})")


# --- fields, by the dataclasses' annotations ---------------------------------------------------

def check_fields(where: str, item: Any, cls) -> None:
    """``item``, a mapping read back from a file, holds the fields of dataclass ``cls``: none
    it does not know, every one without a default, each of its annotated type; else
    ``ValueError`` naming ``where`` and the field."""
    _expect(isinstance(item, dict), where, "must be a mapping")
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(item) - set(known))
    _expect(not unknown, where, f"has unknown field(s) {', '.join(map(short_repr, unknown[:3]))}")
    for name, f in known.items():
        if name not in item:
            required = f.default is MISSING and f.default_factory is MISSING
            _expect(not required, where, f"has no {name!r}")
            continue
        _expect(_of_type(item[name], f.type), f"{where}.{name}",
                f"must be {_WORDS.get(f.type, f.type)}, got {short_repr(item[name])}")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_float(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _pair_of(test):
    return lambda v: isinstance(v, (list, tuple)) and len(v) == 2 and all(map(test, v))


def _is_rect(value) -> bool:
    return isinstance(value, list) and len(value) == 5 and all(map(_is_int, value))


def _list_of(test):
    return lambda v: isinstance(v, list) and all(map(test, v))


def _dict_of(test):
    return lambda v: isinstance(v, dict) and all(isinstance(k, str) and test(x)
                                                 for k, x in v.items())


def _or_none(test):
    return lambda v: v is None or test(v)


_TYPES = {
    "int": _is_int, "str": lambda v: isinstance(v, str), "bool": lambda v: isinstance(v, bool),
    "str | None": _or_none(lambda v: isinstance(v, str)),
    "Rect": _is_rect, "list[Rect]": _list_of(_is_rect), "list[int]": _list_of(_is_int),
    "list[str]": _list_of(lambda v: isinstance(v, str)),
    "list[int] | None": _or_none(_list_of(_is_int)), "int | None": _or_none(_is_int),
    "dict[str, str]": _dict_of(lambda v: isinstance(v, str)),
    "dict[str, int]": _dict_of(_is_int), "dict[str, Any]": _dict_of(lambda v: True),
    "float": _is_float, "float | None": _or_none(_is_float),
    "tuple[int, int] | None": _or_none(_pair_of(_is_int)),
    "tuple[str, str]": _pair_of(lambda v: isinstance(v, str)),
    "tuple[str, ...]": _list_of(lambda v: isinstance(v, str)),
}
_WORDS = {"int": "a whole number", "str": "a string", "bool": "true or false",
          "str | None": "a string or null",
          "Rect": "a rectangle [system, x, y, w, h]", "list[Rect]": "a list of rectangles",
          "list[int]": "a list of whole numbers", "int | None": "a whole number or null",
          "list[int] | None": "a list of whole numbers or null", "float": "a number",
          "float | None": "a number or null",
          "tuple[int, int] | None": "two whole numbers or null",
          "tuple[str, str]": "two strings", "tuple[str, ...]": "a list of strings"}


def _of_type(value, annotation: str) -> bool:
    test = _TYPES.get(annotation)
    if test is None:
        raise TypeError(f"program_check has no test for a field of type {annotation}")
    return test(value)


def _contains(outer: list, inner: list) -> bool:
    s0, x0, y0, w0, h0 = outer
    s1, x1, y1, w1, h1 = inner
    return s0 == s1 and x0 <= x1 and x1 + w1 <= x0 + w0 and y0 <= y1 and y1 + h1 <= y0 + h0


def _index(where: str, value: int, items: list) -> None:
    _expect(0 <= value < len(items), where, f"{value} points past the {len(items)} listed")


def _one_of(where: str, value, allowed: tuple) -> None:
    _expect(value in allowed, where, f"{short_repr(value)} is not one of "
            f"{', '.join(map(repr, allowed))}")


def _expect(ok: bool, where: str, what: str) -> None:
    if not ok:
        raise ValueError(f"{where} {what}")
