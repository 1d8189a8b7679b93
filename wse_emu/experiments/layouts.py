"""The layouts an experiment compares when its plans are named by their hardware: a split with
prefill on one pool and decode on another (``--prefill-pool``, ``--decode-pool``), against
colocated serving on as much of each kind of hardware in the split (or of a ``--pool`` named
for it) in the same footprint.

The footprint (``Footprint``) is counted in systems (a wafer is one, a CS-3; an accelerator
instance one; a node of GPUs one, eight H200s, and part of a node a whole one), in racks from
the units per rack the user gives for each kind, in kW of the presets' power, or in a cost per
hour from prices the user gives per unit of each kind (none is invented). The colocated plan
gets, of every kind it may use, as many units as fit in the split's footprint, and its tuning
picks among them as it picks among copies per wafer, so each plan has the same tuning effort.
Where whole units cannot match the split's footprint exactly (racks, kW, cost), every layout
is reported per unit of its own footprint.

Each kind of hardware says the layouts a side of it may take (``PoolKind.variants``): a GPU
side whose tensor parallel degree is not named is tried at every degree that holds the model,
so an experiment on eight H200s split every way (``every_split``) tries the splits
AIConfigurator tries.

Nothing here times a step: a side's pools come from ``side_pools``, which the caller gives
(``wse_emu.api``, through each kind's ``PoolKind.pools``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from wse_emu.errors import UserError
from wse_emu.experiments.tuning import Layout
from wse_emu.pools.kinds.base import Side
from wse_emu.pools.names import MAX_UNITS, PoolName, parse_pool
from wse_emu.util.checks import is_number, short_repr


def variants(name: PoolName, model, copies: tuple = (1,), depths: tuple = ()) -> list[Side]:
    """``name`` in every layout its kind may take (``PoolKind.variants``): a wafer with each
    of ``copies`` per wafer, at its own depth and each of ``depths``; a GPU pool at every
    tensor parallel degree that holds the model; an accelerator as its file lays it out."""
    return name.kind.variants(name, model, copies, depths)


def systems_of(names: list[PoolName]) -> int:
    """The footprint of pools together, in systems: units of one kind of hardware that share
    a system (GPUs in a node) are counted together."""
    units: dict = {}
    for n in names:
        units[n.hardware.name] = units.get(n.hardware.name, 0) + n.count
    per = {n.hardware.name: n.kind.per_system(n.hardware) for n in names}
    return sum(-(-count // per[name]) for name, count in units.items())


FOOTPRINTS = {"systems": "system", "racks": "rack", "kw": "kW",
              "cost": "cost/h"}  # name -> its unit
# What the user gives per kind of hardware, by the API's parameter: what one number is (one,
# then several), and the footprint it counts.
PER_KIND = {"prices": ("a price per hour", "prices per hour", "cost"),
            "units_per_rack": ("units per rack", "units per rack", "racks")}


def per_kind_text(what: str, name, value) -> str:
    """One number given per kind (``prices``, ``units_per_rack``) as a message names it:
    `prices=h200=2`, which the command line writes as its flag, --price h200=2."""
    shown = f"{value:g}" if is_number(value) else short_repr(value)
    return f"`{what}={name}={shown}`"


@dataclass(frozen=True)
class Footprint:
    """How a footprint is counted: ``kind`` (one of ``FOOTPRINTS``) and what the user gives
    for it, per kind of hardware by its name (``wse3``, ``trn2``, ``h200``): for ``cost`` the
    price per hour of one unit (a wafer system, an accelerator instance, a GPU), for
    ``racks`` the units one rack holds (racks counted in fractions: units of several kinds
    share none)."""

    kind: str = "systems"
    prices: tuple = ()  # ((hardware name, price per unit-hour), ...)
    per_rack: tuple = ()  # ((hardware name, units per rack), ...)

    def __post_init__(self):
        if not isinstance(self.kind, str) or self.kind not in FOOTPRINTS:
            raise UserError(f"`footprint` must be one of {', '.join(FOOTPRINTS)}, got "
                            f"{short_repr(self.kind)}")
        for what, given in (("prices", self.prices), ("units_per_rack", self.per_rack)):
            noun, nouns, counted = PER_KIND[what]
            for pair in given:
                if not isinstance(pair, tuple) or len(pair) != 2:
                    raise UserError(f"`{what}` must be (hardware name, number) pairs, got "
                                    f"{short_repr(pair)}")
                name, value = pair
                if not isinstance(name, str) or not name.strip():
                    raise UserError(f"{per_kind_text(what, name, value)}: name the kind of "
                                    "hardware it is for (wse3, trn2, h200)")
                if not is_number(value) or not 0 < value < math.inf:
                    raise UserError(f"{per_kind_text(what, name, value)}: {noun} must be a "
                                    "positive number")
            if given and self.kind != counted:
                raise UserError(f"{nouns} (`{what}`) are only for a footprint in {counted} "
                                f"(`footprint={counted}`), not in {self.kind}")
            names = [name for name, _ in given]
            twice = next((n for n in names if names.count(n) > 1), None)
            if twice is not None:
                raise UserError(f"`{what}` gives {twice} more than once")

    @property
    def unit(self) -> str:
        return FOOTPRINTS[self.kind]

    def of(self, names: list[PoolName]) -> float:
        """The footprint of pools together, in this unit."""
        if self.kind == "systems":
            return float(systems_of(names))
        return sum(n.count * self._per_unit(n) for n in names)

    def _per_unit(self, name: PoolName) -> float:
        hw = name.hardware
        if self.kind == "kw":
            watts = name.kind.power_w(hw)
            if not watts:
                raise UserError(f"{hw.name} has no wall power stated: a footprint in kW needs "
                                "one (its preset or YAML)")
            return watts / 1e3
        if self.kind == "racks":
            per_rack = dict(self.per_rack)
            if hw.name not in per_rack:
                raise UserError(f"a footprint in racks (`footprint=racks`) needs how many "
                                f"{hw.name} units a rack holds: `units_per_rack={hw.name}=N`; "
                                f"given for: {', '.join(per_rack) or 'none'}")
            return 1.0 / per_rack[hw.name]
        prices = dict(self.prices)
        if hw.name not in prices:
            raise UserError(f"a footprint in cost (`footprint=cost`) needs the price per hour "
                            f"of one {hw.name}: `prices={hw.name}=PER_HOUR`; given for: "
                            f"{', '.join(prices) or 'none'}")
        return prices[hw.name]


def colocated_names(splits: list[tuple[PoolName, PoolName]], named: list[PoolName],
                    footprint: Footprint = Footprint()) -> list[PoolName]:
    """The colocated plan's hardware: ``named`` (``--pool``) if given, else every kind in the
    splits, each with as many units as fit in the splits' footprint (the same for every
    split); a kind of which not one unit fits is left out."""
    if named:
        return named
    budget = footprint.of(list(splits[0]))
    kinds = {}
    for pair in splits:
        for n in pair:
            kinds.setdefault(n.hardware.name, n)
    out = []
    for n in kinds.values():
        if footprint.kind == "systems":
            count = int(budget) * n.kind.per_system(n.hardware)
        else:
            one = footprint.of([parse_pool(_base(n))])
            count = int(budget / one * (1 + 1e-9))
        if count >= 1:
            out.append(parse_pool(f"{_base(n)}x{min(count, MAX_UNITS)}"))
    if not out:
        raise UserError(f"not one unit of {' or '.join(kinds)} fits the split's footprint")
    return out


def _base(name: PoolName) -> str:
    """The name a pool's hardware goes by on the command line, without its count."""
    text = name.text
    cut = text.rfind("x")
    return text[:cut] if cut > 0 and text[cut + 1:].split("tp")[0].isdigit() else text


def every_split(name: PoolName) -> list[tuple[PoolName, PoolName]]:
    """Every split of the units of ``name`` (``h200x8``: eight GPUs; ``wse3x4``: four
    systems) between prefill and decode, whole units to each side."""
    if name.count < 2:
        raise UserError(f"pool '{name.text}' has one unit: a split needs two or more")
    base = _base(name)
    return [(parse_pool(f"{base}x{p}"), parse_pool(f"{base}x{name.count - p}"))
            for p in range(1, name.count)]


def plan_pools(pool: str | None, prefill_pool: str | None, decode_pool: str | None,
               split_pool: str | None,
               footprint: Footprint = Footprint()) -> tuple[list, list] | None:
    """The splits and the colocated hardware an experiment compares, from the pools named
    (None: none named, the experiment is on one compiled cluster): ``prefill_pool`` with
    ``decode_pool`` (and ``pool``, the colocated plan's hardware, if not every kind of the
    split in its footprint), or ``split_pool`` (every split of it, against colocated serving
    on all of it)."""
    if split_pool is not None:
        if any(t is not None for t in (pool, prefill_pool, decode_pool)):
            raise UserError("`split_pool` goes alone: it is split every way and serves "
                            "colocated whole")
        whole = parse_pool(split_pool)
        return every_split(whole), [whole]
    if prefill_pool is None and decode_pool is None:
        if pool is not None:
            raise UserError("`pool` names the colocated plan's hardware beside a split: give "
                            "`prefill_pool` and `decode_pool` too (or `split_pool`)")
        return None
    if prefill_pool is None or decode_pool is None:
        raise UserError("`prefill_pool` and `decode_pool` go together")
    splits = [(parse_pool(prefill_pool), parse_pool(decode_pool))]
    colocated = [parse_pool(pool)] if pool is not None else []
    mine, theirs = footprint.of(colocated), footprint.of(list(splits[0]))
    if colocated and mine > theirs * (1 + 1e-9):
        raise UserError(f"pool '{pool}' takes {mine:g} {footprint.unit}; the split takes "
                        f"{theirs:g}: the colocated plan's footprint may not be larger")
    return splits, colocated_names(splits, colocated, footprint)


def pool_layouts(model, splits: list[tuple[PoolName, PoolName]], colocated: list[PoolName],
                 side_pools, footprint: Footprint = Footprint(), copies: tuple = (1,),
                 depths: tuple = ()) -> tuple[dict, list[str]]:
    """Every layout of both plans ((plan, name) -> Layout, each with its footprint), and why
    any was skipped. ``side_pools(side, role, first_system)``: the pools of one side in
    ``role`` (mixed, prefill or decode), its systems numbered from ``first_system``; a wafer
    side with each of ``copies`` per wafer, at its own depth and each of ``depths``. Every
    split must take the same footprint as the first."""
    size = footprint.of(list(splits[0]))
    for pair in splits:
        if abs(footprint.of(list(pair)) - size) > 1e-9 * size:
            raise UserError(f"every split must take the same footprint: {pair[0].text} + "
                            f"{pair[1].text} take {footprint.of(list(pair)):g} "
                            f"{footprint.unit}, not {size:g}")
    layouts, skipped = {}, []

    def tried(plan: str, name: str, names: list, build) -> None:
        try:
            pools = build()
        except UserError as exc:  # a side the model does not fit: skipped, with why
            skipped.append(f"{plan} {name}: {exc}")
            return
        for k, p in enumerate(pools):  # names unique within the layout
            pools[k] = replace(p, name=f"{p.role}{k}")
        layouts[(plan, name)] = Layout(plan, name, pools, footprint.of(names))

    def sides(plan: str, name: PoolName) -> list[Side]:
        try:
            return variants(name, model, copies, depths)
        except UserError as exc:  # a GPU pool too small for any copy: skipped, with why
            skipped.append(f"{plan} {name.text}: {exc}")
            return []

    for name in colocated:
        for side in sides("colocated", name):
            tried("colocated", side.label, [name],
                  lambda side=side: side_pools(side, "mixed", 0))
    for prefill, decode in splits:
        for p in sides("disaggregated", prefill):
            for d in sides("disaggregated", decode):
                first = systems_of([prefill])
                tried("disaggregated", f"{p.label} prefill / {d.label} decode",
                      [prefill, decode], lambda p=p, d=d, first=first:
                      side_pools(p, "prefill", 0) + side_pools(d, "decode", first))
    for plan in ("colocated", "disaggregated"):
        if not any(p == plan for p, _ in layouts):
            raise UserError(f"no {plan} layout holds {model.name}: " + "; ".join(skipped))
    return layouts, list(dict.fromkeys(skipped))


@dataclass(frozen=True)
class PoolHardware:
    """What an experiment reads of a cluster's fabric, for pools named by their hardware: the
    serving clock, the name it is reported by, and no wall power (the kinds differ)."""

    name: str
    clock_hz: float
    system_power_w: float = 0.0


@dataclass(frozen=True)
class PoolCluster:
    """The footprint both plans share, as an experiment reads a cluster: its systems (which
    size the tuning runs), and the unit every layout's results are reported per."""

    fabric: PoolHardware
    systems: int
    unit: str = "system"


def pools_name(splits: list, colocated: list, footprint: Footprint = Footprint()) -> str:
    """How a report names the hardware of both plans (after their count of systems)."""
    split = (f"every split of {colocated[0].text}" if len(splits) > 1
             else f"{splits[0][0].text} prefill + {splits[0][1].text} decode")
    size = "" if footprint.kind == "systems" else \
        f"{footprint.of(list(splits[0])):g} {footprint.unit}, "
    return f"footprint ({size}{split}; colocated on {' or '.join(n.text for n in colocated)})"
