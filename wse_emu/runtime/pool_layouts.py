"""The layouts an experiment compares when its plans are named by their hardware: a split with
prefill on one pool and decode on another (``--prefill-pool``, ``--decode-pool``), against
colocated serving on as much of each kind of hardware in the split (or of a ``--pool`` named
for it) in the same footprint.

The footprint is counted in systems: a wafer is one (a CS-3), an accelerator instance one, a
node of GPUs one (eight H200s), a part of a node a whole one. The colocated plan gets the
split's systems of every kind it may use, and its tuning picks among them as it picks among
copies per wafer, so each plan has the same tuning effort and the same footprint.

A GPU side whose tensor parallel degree is not named is tried at every degree that holds
the model (``gpu_pool.tensor_parallel`` and each power of two above it, within a node): an
experiment on eight H200s split every way (``every_split``) tries the splits AIConfigurator
tries.

Nothing here compiles: a wafer side's pools come from ``side_pools``, which the caller gives
(``wse_emu.api`` compiles them).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from wse_emu.errors import UserError
from wse_emu.pool_names import PoolName, parse_pool
from wse_emu.runtime.gpu_pool import tensor_parallel
from wse_emu.runtime.tuning import Layout


@dataclass(frozen=True)
class Side:
    """One side of a plan: a pool as named, at one tensor parallel degree (GPUs only)."""

    pool: PoolName
    tp: int | None = None

    @property
    def label(self) -> str:
        hw = self.pool.hardware
        if self.pool.is_gpu:
            return f"{self.pool.count} x {hw.name} tp{self.tp}"
        return hw.name if self.pool.count == 1 else f"{self.pool.count} x {hw.name}"


def variants(name: PoolName, model) -> list[Side]:
    """``name`` at every tensor parallel degree it may take: the named one, or (a GPU pool
    named without one) each power of two from the fewest GPUs that hold the model to a node
    or the pool's GPUs; one side for a wafer or an accelerator."""
    if not name.is_gpu:
        return [Side(name)]
    if name.tensor_parallel is not None:
        return [Side(name, tensor_parallel(name.hardware, model, name.count,
                                           name.tensor_parallel))]
    tp = tensor_parallel(name.hardware, model, name.count)
    out = []
    while tp <= min(name.count, name.hardware.gpus_per_node):
        if name.count % tp == 0:
            out.append(Side(name, tp))
        tp *= 2
    return out


def systems_of(names: list[PoolName]) -> int:
    """The footprint of pools together, in systems: GPUs of one kind share nodes."""
    gpus: dict = {}
    total = 0
    for n in names:
        if n.is_gpu:
            gpus[n.hardware.name] = gpus.get(n.hardware.name, 0) + n.count
        else:
            total += n.count
    for name, count in gpus.items():
        node = next(n.hardware.gpus_per_node for n in names if n.hardware.name == name)
        total += -(-count // node)
    return total


def colocated_names(splits: list[tuple[PoolName, PoolName]],
                    named: list[PoolName]) -> list[PoolName]:
    """The colocated plan's hardware: ``named`` (``--pool``) if given, else every kind in the
    splits, each in the splits' footprint (their systems, the same for every split)."""
    if named:
        return named
    footprint = systems_of(list(splits[0]))
    kinds = {}
    for pair in splits:
        for n in pair:
            kinds.setdefault(n.hardware.name, n)
    out = []
    for n in kinds.values():
        count = footprint * (n.hardware.gpus_per_node if n.is_gpu else 1)
        out.append(parse_pool(f"{_base(n)}x{count}"))
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
               split_pool: str | None) -> tuple[list, list] | None:
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
    if colocated and systems_of(colocated) != systems_of(list(splits[0])):
        raise UserError(f"pool '{pool}' takes {systems_of(colocated)} systems; the split "
                        f"takes {systems_of(list(splits[0]))}: the plans share one footprint")
    return splits, colocated_names(splits, colocated)


def pool_layouts(model, splits: list[tuple[PoolName, PoolName]], colocated: list[PoolName],
                 side_pools) -> tuple[dict, list[str]]:
    """Every layout of both plans ((plan, name) -> Layout), and why any was skipped.
    ``side_pools(side, role, first_system)``: the pools of one side in ``role`` (mixed,
    prefill or decode), its systems numbered from ``first_system``. Every split must take the
    same footprint as the first."""
    footprint = systems_of(list(splits[0]))
    for pair in splits:
        if systems_of(list(pair)) != footprint:
            raise UserError(f"every split must take the same systems: {pair[0].text} + "
                            f"{pair[1].text} take {systems_of(list(pair))}, not {footprint}")
    layouts, skipped = {}, []

    def tried(plan: str, name: str, build) -> None:
        try:
            pools = build()
        except UserError as exc:  # a side the model does not fit: skipped, with why
            skipped.append(f"{plan} {name}: {exc}")
            return
        for k, p in enumerate(pools):  # names unique within the layout
            pools[k] = replace(p, name=f"{p.role}{k}")
        layouts[(plan, name)] = Layout(plan, name, pools)

    for name in colocated:
        for side in variants(name, model):
            tried("colocated", side.label, lambda side=side: side_pools(side, "mixed", 0))
    for prefill, decode in splits:
        for p in variants(prefill, model):
            for d in variants(decode, model):
                first = systems_of([prefill])
                tried("disaggregated", f"{p.label} prefill / {d.label} decode",
                      lambda p=p, d=d, first=first: side_pools(p, "prefill", 0)
                      + side_pools(d, "decode", first))
    for plan in ("colocated", "disaggregated"):
        if not any(p == plan for p, _ in layouts):
            raise UserError(f"no {plan} layout holds {model.name}: " + "; ".join(skipped))
    return layouts, skipped


@dataclass(frozen=True)
class PoolHardware:
    """What an experiment reads of a cluster's fabric, for pools named by their hardware: the
    serving clock, the name it is reported by, and no wall power (the kinds differ)."""

    name: str
    clock_hz: float
    system_power_w: float = 0.0


@dataclass(frozen=True)
class PoolCluster:
    """The footprint both plans share, as an experiment reads a cluster: its systems."""

    fabric: PoolHardware
    systems: int


def pools_name(splits: list, colocated: list) -> str:
    """How a report names the hardware of both plans (after their count of systems)."""
    split = (f"every split of {colocated[0].text}" if len(splits) > 1
             else f"{splits[0][0].text} prefill + {splits[0][1].text} decode")
    return f"footprint ({split}; colocated on {' or '.join(n.text for n in colocated)})"
