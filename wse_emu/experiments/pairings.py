"""Every pairing of kinds of hardware, each as its own frontier: prefill on one kind, decode on
another (or the same), against colocated serving on the kinds of that pairing in its footprint
(``api.pairings`` runs them; ``visualize.curves.pairings`` draws them on one figure).

A pairing the model does not fit, or that the footprint cannot hold, is kept with why."""

from __future__ import annotations

from dataclasses import dataclass, field

from wse_emu.experiments.frontier import FrontierReport


def pairing_label(prefill: str, decode: str) -> str:
    return f"{prefill} prefill + {decode} decode"


@dataclass
class PairingsReport:
    """Each pairing's frontier (by ``pairing_label``), in the order run, and the pairings
    skipped with why. ``to_json()`` is ``experiment pairings --json`` and pairings.json."""

    model: str
    workload: str
    kinds: list[str]
    footprint_unit: str
    frontiers: dict[str, FrontierReport]
    skipped: dict[str, str] = field(default_factory=dict)

    def colocated(self) -> dict[str, FrontierReport]:
        """The frontiers whose colocated plan serves on one kind alone (the pairings of a kind
        with itself), by that kind: each kind's colocated frontier."""
        return {label.split(" prefill")[0]: f for label, f in self.frontiers.items()
                if label == pairing_label(*[label.split(" prefill")[0]] * 2)}

    def to_json(self) -> dict:
        return {"model": self.model, "workload": self.workload, "kinds": self.kinds,
                "footprint_unit": self.footprint_unit,
                "frontiers": {k: f.to_json() for k, f in self.frontiers.items()},
                "skipped": self.skipped}

    @classmethod
    def from_json(cls, data: dict) -> "PairingsReport":
        return cls(data["model"], data["workload"], list(data["kinds"]),
                   data.get("footprint_unit", "system"),
                   {k: FrontierReport.from_json(f) for k, f in data["frontiers"].items()},
                   dict(data.get("skipped", {})))
