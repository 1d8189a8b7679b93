"""The WaferProgram: what the compiler produces and the engines execute.

A program is saved as ``program.json`` (structure: regions, stages, kernels, routes, bounds) plus
``program.npz`` (per-PE arrays of every system: SRAM bytes by category, stage ids, color masks).
Both carry ``FORMAT_VERSION``; loading checks it, so an old file fails with a clear message
instead of being misread. Kernels are stored as a pattern and its parameters, never as per-PE
instruction lists: engines expand patterns into per-PE work themselves.
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from wse_emu.errors import UserError
from wse_emu.hardware.fabric import FabricSpec, fabric_from_dict
from wse_emu.models.spec import ModelSpec, model_from_dict
from wse_emu.program.options import CompileOptions
from wse_emu.program.schema import check_program
from wse_emu.util.atomic import cannot_write, replacing, write_text
from wse_emu.util.configfile import regular_file

FORMAT = "wse-emu-program"
# 2: KV cache by columns and rows (program.kvlayout), reduction tree levels; 3: expert strips
# run a pattern of their own (``expert_runs``), looked up in ``kernels.patterns``.
FORMAT_VERSION = 3

# Per-PE SRAM categories, in the order reports list them.
SRAM_CATEGORIES = ("weights", "kv_cache", "activations", "reserved")


@dataclass(frozen=True)
class Rect:
    """A rectangle of PEs on one system: columns x .. x+w-1, rows y .. y+h-1."""

    system: int
    x: int
    y: int
    w: int
    h: int

    @property
    def area(self) -> int:
        return self.w * self.h

    @property
    def x1(self) -> int:
        return self.x + self.w

    @property
    def y1(self) -> int:
        return self.y + self.h

    def center(self) -> tuple[float, float]:
        return (self.x + (self.w - 1) / 2, self.y + (self.h - 1) / 2)

    def overlaps(self, other: "Rect") -> bool:
        return (self.system == other.system and self.x < other.x1 and other.x < self.x1
                and self.y < other.y1 and other.y < self.y1)

    def contains(self, other: "Rect") -> bool:
        return (self.system == other.system and self.x <= other.x and other.x1 <= self.x1
                and self.y <= other.y and other.y1 <= self.y1)

    def bbox(self, other: "Rect") -> "Rect":
        x0, y0 = min(self.x, other.x), min(self.y, other.y)
        return Rect(self.system, x0, y0, max(self.x1, other.x1) - x0, max(self.y1, other.y1) - y0)

    def slices(self) -> tuple[int, slice, slice]:
        """Index into a (systems, height, width) per-PE array."""
        return self.system, slice(self.y, self.y1), slice(self.x, self.x1)

    def to_list(self) -> list[int]:
        return [self.system, self.x, self.y, self.w, self.h]

    @classmethod
    def from_list(cls, values: list[int]) -> "Rect":
        return cls(*(int(v) for v in values))

    def __str__(self) -> str:
        where = f"/s{self.system}" if self.system else ""
        return f"{self.w}x{self.h}@({self.x},{self.y}){where}"


@dataclass
class Region:
    """A set of PEs holding one model replica, with a role: prefill, decode or mixed."""

    name: str
    role: str
    replica: int
    parts: list[Rect]
    stage_ids: list[int] = field(default_factory=list)
    kv_capacity_tokens: int = 0
    weight_bytes: int = 0

    @property
    def pes(self) -> int:
        return sum(p.area for p in self.parts)


@dataclass
class Stage:
    """Consecutive layers on one rectangle; their kernels' weights stay resident there."""

    id: int
    region: str
    index: int  # position in the region's pipeline
    rect: Rect
    layers: list[int]  # first, last + 1
    has_embedding: bool
    has_head: bool
    strip_axis: str  # "x": kernels are full-height column strips; "y": full-width row strips
    kernel_ids: list[int] = field(default_factory=list)
    kv_slots: int = 0
    kv_capacity_tokens: int = 0
    bounds: dict[str, Any] = field(default_factory=dict)
    # A stage holding one part of a mixture-of-experts layer split across two stages: the
    # range of the layer's experts it holds (``layer.part_ops``); None for whole layers.
    experts: list[int] | None = None

    @property
    def num_layers(self) -> int:
        return self.layers[1] - self.layers[0]

    @property
    def part(self) -> tuple[int, int] | None:
        return tuple(self.experts) if self.experts is not None else None

    @property
    def has_attention(self) -> bool:
        """Whether the stage runs attention (and so keeps a KV cache): the second part of a
        split layer does not."""
        return self.num_layers > 0 and (self.experts is None or self.experts[0] == 0)

    def describe_layers(self) -> str:
        """'3-5', or a split layer's part with its experts: '7 (experts 0-79)'."""
        l0, l1 = self.layers
        if self.experts is not None:
            return f"{l0} (experts {self.experts[0]}-{self.experts[1] - 1})"
        return f"{l0}-{l1 - 1}"


@dataclass
class Kernel:
    """One op of the stage's layers on a PE sub-grid, stored as a dataflow pattern.

    ``matrix`` is (K, N) for matrix kernels: the grid's columns split K (inputs broadcast down
    columns), its rows split N (partial sums reduced along rows to the ``root`` edge). Vector
    kernels (norms, elementwise) keep ``length`` elements split over their rows.
    """

    id: int
    stage: int
    name: str
    kind: str  # matrix, gather, norm, elementwise, attention
    pattern: dict[str, str]  # phase -> dataflow pattern
    rect: Rect
    layers: int
    ops: list[str]
    matrix: list[int] | None = None  # (K, N)
    grid: list[int] | None = None  # (parts of K, parts of N)
    k_axis: str = ""  # "x": columns split K; "y": rows split K
    length: int | None = None  # vector kernels: elements per layer, split over the rect
    weight_bytes: int = 0  # owned by this kernel, all its layers
    weight_ref: int | None = None  # kernel that owns the weights this kernel reads (tied)
    root: str = ""  # edge where outputs collect: "east", "west", "south", "north"
    # Levels of each of its reduction trees (``program.trees``), chosen by the compiler from
    # the cost model: "reduce" (partial sums along a strip, a norm's line), "along" and
    # "across" (attention's partial outputs along the long side, scores across a head's rows).
    trees: dict[str, int] = field(default_factory=dict)
    bounds: dict[str, Any] = field(default_factory=dict)


@dataclass
class Route:
    """A static color route: its footprint (the PEs whose routers it configures) and color."""

    id: int
    kind: str
    name: str
    footprint: Rect
    color: int = -1
    src: int | None = None  # kernel id
    dst: list[int] = field(default_factory=list)
    stage: int | None = None
    bytes_per_token: int = 0
    hops: int = 0
    offwafer: bool = False


@dataclass
class WaferProgram:
    fabric: FabricSpec
    systems: int
    model: ModelSpec
    options: CompileOptions  # what it was compiled with (program.json: their ``to_dict``)
    regions: list[Region]
    stages: list[Stage]
    kernels: list[Kernel]
    routes: list[Route]
    arrays: dict[str, np.ndarray]  # name -> (systems, height, width)
    summary: dict[str, Any] = field(default_factory=dict)
    # Speculative decoding's draft, compiled on its own strip of the wafer (its fabric is that
    # strip), beside each replica of this program's model (``compiler.draft``); None: none.
    draft: "WaferProgram | None" = None

    def __post_init__(self):
        # Options handed over in their JSON form (as the compiler's mapper does) are kept as
        # CompileOptions all the same.
        if isinstance(self.options, dict):
            self.options = CompileOptions.from_json(self.options)

    # --- lookups --------------------------------------------------------------------------
    def region(self, name: str) -> Region:
        for region in self.regions:
            if region.name == name:
                return region
        raise UserError(
            f"no region named {name!r}: choose one of {', '.join(r.name for r in self.regions)}"
        )

    def region_for(self, phase: str, name: str | None = None) -> Region:
        """The region named ``name``, else the first whose role is ``phase`` (prefill or
        decode), else the first mixed one, else the first."""
        if name:
            return self.region(name)
        for role in (phase, "mixed"):
            for r in self.regions:
                if r.role == role:
                    return r
        return self.regions[0]

    def stage_kernels(self, stage: Stage) -> list[Kernel]:
        return [self.kernels[k] for k in stage.kernel_ids]

    def sram_total(self) -> np.ndarray:
        return sum(self.arrays[f"sram_{c}"].astype(np.int64) for c in SRAM_CATEGORIES)

    # --- serialization --------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        def dump(obj):
            out = {}
            for f in fields(obj):
                value = getattr(obj, f.name)
                if isinstance(value, Rect):
                    value = value.to_list()
                elif isinstance(value, list) and value and isinstance(value[0], Rect):
                    value = [r.to_list() for r in value]
                out[f.name] = value
            return out

        out = {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "fabric": self.fabric.to_dict(),
            "systems": self.systems,
            "model": self.model.to_dict(),
            "options": self.options.to_dict(),
            "summary": self.summary,
            "regions": [dump(r) for r in self.regions],
            "stages": [dump(s) for s in self.stages],
            "kernels": [dump(k) for k in self.kernels],
            "routes": [dump(r) for r in self.routes],
        }
        if self.draft is not None:  # a program without a draft reads as before
            out["draft"] = self.draft.to_json()
        return out

    def all_arrays(self) -> dict[str, np.ndarray]:
        """Its per-PE arrays and its draft's, the draft's named ``draft.NAME``."""
        if self.draft is None:
            return self.arrays
        return {**self.arrays, **{f"{DRAFT_PREFIX}{k}": v for k, v in self.draft.arrays.items()}}

    def save(self, directory: str | Path) -> None:
        """Write program.json and program.npz into ``directory`` (created if needed), with a
        digest of both in program.json, so that a file damaged or edited since is refused."""
        directory = Path(directory)
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise cannot_write(directory, exc) from None
        data = json.loads(json.dumps(self.to_json(), default=_json_default))
        arrays = self.all_arrays()
        data["digest"] = _digest_of(data, arrays)
        # Each file whole or not at all; the arrays first, so that a program.json is never
        # there before the program.npz its digest was taken with.
        with replacing(directory / "program.npz") as fh:
            np.savez_compressed(fh, format_version=np.int32(FORMAT_VERSION), **arrays)
        write_text(directory / "program.json", json.dumps(data, indent=1))

    @classmethod
    def load(cls, directory: str | Path, written_here: bool = False) -> "WaferProgram":
        """The program saved in ``directory``, checked: its format, its digest and its
        schema. ``written_here``: a program this code saved itself (the compile cache's,
        whose key names the code): its digest must be there and match, which proves it
        unchanged since, so the schema it passed when compiled is not checked again."""
        directory = Path(directory)
        path = directory / "program.json"
        regular_file(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except OSError:
            raise UserError(
                f"{directory}: no program.json (compile one with 'wse-emu compile')") from None
        except json.JSONDecodeError as exc:
            raise UserError(f"{path}: malformed JSON (line {exc.lineno})") from None
        if data.get("format") != FORMAT or data.get("version") != FORMAT_VERSION:
            raise UserError(
                f"{path}: not a version-{FORMAT_VERSION} wse-emu program "
                f"(found format {data.get('format')!r}, version {data.get('version')!r}); "
                "recompile it"
            )
        regular_file(directory / "program.npz")
        try:
            with np.load(directory / "program.npz", allow_pickle=False) as npz:
                arrays = {k: npz[k] for k in npz.files if k != "format_version"}
                version = int(npz["format_version"])
        except (OSError, KeyError, ValueError, EOFError, TypeError, zipfile.BadZipFile):
            raise UserError(
                f"{directory}: program.npz is missing or unreadable; recompile") from None
        if version != FORMAT_VERSION:
            raise UserError(f"{directory}: program.npz is version {version}; recompile")
        # Programs written before digests were kept have none; every later one must match.
        if written_here and "digest" not in data:
            raise UserError(f"{directory}: no digest; recompile")
        if "digest" in data and data.get("digest") != _digest_of(data, arrays):
            raise UserError(f"{directory}: program.json or program.npz changed since it was "
                            "compiled (they no longer match the digest written then); "
                            "recompile")
        try:
            return cls._from_data(data, arrays, path, checked=not written_here)
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
            what = f"missing {exc}" if isinstance(exc, KeyError) else " ".join(str(exc).split())
            raise UserError(f"{path}: damaged ({what[:120]}); recompile") from None

    @classmethod
    def _from_data(cls, data: dict, arrays: dict, path: Path,
                   checked: bool = True) -> "WaferProgram":

        def build(cls_, item):
            kwargs = {}
            for f in fields(cls_):
                if f.name not in item:
                    continue
                value = item[f.name]
                if f.type in ("Rect",) and value is not None:
                    value = Rect.from_list(value)
                elif f.type == "list[Rect]":
                    value = [Rect.from_list(v) for v in value]
                kwargs[f.name] = value
            return cls_(**kwargs)

        draft = None
        if "draft" in data:
            own = {k[len(DRAFT_PREFIX):]: v for k, v in arrays.items()
                   if k.startswith(DRAFT_PREFIX)}
            arrays = {k: v for k, v in arrays.items() if not k.startswith(DRAFT_PREFIX)}
            draft = cls._from_data(data["draft"], own, path, checked)
        fabric = fabric_from_dict(data["fabric"], str(path))
        model = model_from_dict(data["model"], str(path))
        if checked:
            check_program(data, fabric, model, arrays, {"regions": Region, "stages": Stage,
                                                        "kernels": Kernel, "routes": Route},
                          SRAM_CATEGORIES)
        return cls(
            fabric=fabric,
            systems=int(data["systems"]),
            model=model,
            options=CompileOptions.from_json(data.get("options", {})),
            regions=[build(Region, r) for r in data["regions"]],
            stages=[build(Stage, s) for s in data["stages"]],
            kernels=[build(Kernel, k) for k in data["kernels"]],
            routes=[build(Route, r) for r in data["routes"]],
            arrays=arrays,
            summary=data.get("summary", {}),
            draft=draft,
        )


DRAFT_PREFIX = "draft."  # the draft's arrays in program.npz


def _digest_of(data: dict, arrays: dict) -> str:
    """A digest of a program's JSON (all but the digest itself) and of its arrays (names,
    dtypes, shapes and bytes)."""
    digest = hashlib.sha256()
    digest.update(json.dumps({k: v for k, v in data.items() if k != "digest"},
                             sort_keys=True).encode())
    hash_arrays(digest, arrays, sorted(arrays))
    return digest.hexdigest()


def hash_arrays(digest, arrays: dict, names) -> None:
    """Feed ``digest`` (a hashlib object) each of ``names``' arrays: its name, dtype, shape and
    bytes, in that order (shared with the stage-table cache's entries)."""
    for name in names:
        value = np.ascontiguousarray(arrays[name])
        digest.update(f"{name}:{value.dtype.str}:{value.shape}".encode())
        digest.update(value.tobytes())


def _json_default(value):
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"cannot serialize {type(value).__name__}")
