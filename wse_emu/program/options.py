"""Compile options: every knob of the mapping compiler in one validated dataclass.

They live in the core because a compiled program keeps them (``WaferProgram.options``): the
engines read the ones that change how a step runs (the routing, the attention tiles), and a
program read back from program.json gets them back as a ``CompileOptions``
(``CompileOptions.from_json``), stored in the same JSON form it was written in
(``to_dict``). The compiler imports them from here (``wse_emu.compiler.options``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from wse_emu.errors import UserError
from wse_emu.models.layer import attention_tile_of
from wse_emu.models.routing import routing_of
from wse_emu.util.checks import check_fields, whole

PLANS = ("colocated", "disaggregated")
# The pattern (``kernels.patterns``) each role of kernel runs by default, in decode and in
# prefill: a role is a kernel kind, or ``experts`` for an expert strip (a matrix kernel). The
# patterns are registered a layer above the program format, so the compiler checks the names
# (``patterns.check``).
DEFAULT_PATTERNS = {
    "matrix": ("gemv_tree", "gemm_stream"), "experts": ("expert_runs", "expert_runs"),
    "gather": ("row_gather", "row_gather"), "norm": ("norm", "norm"),
    "elementwise": ("elementwise", "elementwise"), "route": ("route", "route"),
    "attention": ("attention_kv_spread", "attention_kv_spread"),
}


@dataclass(frozen=True)
class CompileOptions:
    plan: str = "colocated"
    # Disaggregated on every wafer: the prefill share of each wafer's columns.
    prefill_share: float | None = None
    # Disaggregated across systems: the first P systems prefill, the rest decode.
    prefill_systems: int | None = None
    # Region rectangle (width, height) for replicas; None picks automatically.
    region: tuple[int, int] | None = None
    # Auto replicas: keep each replica's weights within this share of its region's usable SRAM
    # so that the rest holds KV cache.
    weight_share_target: float = 0.5
    max_replicas_per_part: int = 64
    # Layers per pipeline stage; None picks the smallest count that maps.
    layers_per_stage: int | None = None
    # Tokens of activation buffer per PE per kernel (2 = double-buffered streaming).
    buffer_tokens: int = 2
    # Placement optimizer.
    optimize_placement: bool = True
    anneal_steps: int = 1500
    seed: int = 0
    # Reference workloads for the bounds stored in the program.
    bound_prefill_tokens: int = 4096
    bound_decode_batch: int = 1
    bound_decode_context: int = 4096
    # A mixture of experts: how a timed step's tokens pick their experts (``uniform`` or
    # ``skewed:S``, wse_emu.models.routing) and the draw's seed.
    routing: str = "uniform"
    routing_seed: int = 0
    # Batch tiling on attention: a decode micro-batch's attention block takes its sequences in
    # tiles of this many, one after another, and the MLP or the experts take them together
    # (0: the whole micro-batch at once). It changes how a step runs, not the mapping.
    attention_tile: int = 0
    # Kernel patterns chosen instead of their role's default (``DEFAULT_PATTERNS``), each
    # "ROLE=NAME" (in both phases) or "ROLE=DECODE,PREFILL": "matrix=gemv_whole,gemm_stream".
    patterns: tuple[str, ...] = ()
    # Speculative decoding's draft, compiled beside the target on a strip of the wafer
    # (``compiler.draft``): a model preset, a model YAML or config.json, or "mtp" (a one-layer
    # head of the target's architecture). None: no draft.
    draft: str | None = None
    # The draft's strip, in columns (with a ``draft``): None, the narrowest that holds it; a
    # wider strip spreads its layer over more PEs (a faster draft) and leaves the target fewer.
    draft_columns: int | None = None
    # Columns left free at the far side of the wafer that holds each replica's last stage:
    # the draft's strip, set by ``draft`` (``compiler.draft``); 0 leaves every column to the
    # target.
    reserved_columns: int = 0
    # The model's embedding and LM head are another program's, not laid out here: an mtp
    # draft's, which uses its target's as published heads do (``compiler.draft``).
    ends_shared: bool = False

    def __post_init__(self):
        check_fields(self)  # each field of its type first: the checks below compare values
        for name in ("max_replicas_per_part", "bound_prefill_tokens", "bound_decode_batch",
                     "bound_decode_context"):
            whole(name, getattr(self, name), 1)
        if self.plan not in PLANS:
            raise UserError(f"`plan` must be one of {', '.join(PLANS)}, got {self.plan!r}")
        if self.prefill_share is not None and self.prefill_systems is not None:
            raise UserError("give `prefill_share` or `prefill_systems`, not both")
        if self.plan == "colocated" and (self.prefill_share is not None
                                         or self.prefill_systems is not None):
            raise UserError("`prefill_share` and `prefill_systems` need `plan=disaggregated`")
        if self.prefill_share is not None and not 0.0 < self.prefill_share < 1.0:
            raise UserError(f"`prefill_share` must be between 0 and 1, got {self.prefill_share}")
        if self.prefill_systems is not None and self.prefill_systems < 1:
            raise UserError(f"`prefill_systems` must be at least 1, got {self.prefill_systems}")
        if self.region is not None and min(self.region) < 1:
            raise UserError(f"`region` must be WxH with positive sides, got {self.region}")
        if self.layers_per_stage is not None and self.layers_per_stage < 1:
            raise UserError(f"`layers_per_stage` must be at least 1, got {self.layers_per_stage}")
        if not 0.0 < self.weight_share_target <= 1.0:
            raise UserError(f"`weight_share_target` must be in (0, 1], got "
                            f"{self.weight_share_target}")
        whole("reserved_columns", self.reserved_columns, 0)
        if self.draft is not None and not self.draft.strip():
            raise UserError("`draft` is empty: name a model, or mtp")
        if self.draft_columns is not None:
            whole("draft_columns", self.draft_columns, 1)
            if self.draft is None:
                raise UserError("`draft_columns` is the draft's strip: give a `draft` too")
        if self.buffer_tokens < 1:
            raise UserError(f"`buffer_tokens` must be at least 1, got {self.buffer_tokens}")
        if self.seed < 0:
            raise UserError(f"`seed` must be 0 or more, got {self.seed}")
        routing_of(self)  # a bad routing fails here, by name
        attention_tile_of(self)  # a negative tile fails here, by name
        object.__setattr__(self, "patterns", tuple(self.patterns))
        chosen = pattern_choices(self.patterns)  # a choice that does not read fails here
        # One spelling per choice: "matrix=gemv_tree,gemv_tree" is "matrix=gemv_tree".
        object.__setattr__(self, "patterns", tuple(
            f"{role}={decode}" if decode == prefill else f"{role}={decode},{prefill}"
            for role, (decode, prefill) in chosen.items()))
        if self.anneal_steps < 0:
            raise UserError(f"`anneal_steps` must be 0 or more, got {self.anneal_steps}")

    def to_dict(self) -> dict:
        """The JSON form a program keeps (``program.json``'s ``options``): every field, pairs
        as lists."""
        out = asdict(self)
        out["region"] = list(self.region) if self.region else None
        out["patterns"] = list(self.patterns)
        return out

    @classmethod
    def from_json(cls, data: dict) -> "CompileOptions":
        """The options a program.json keeps (``to_dict``'s form), checked: a field this
        version does not know, or a value it refuses, raises ``ValueError`` naming it (a
        program read back reports it in one line); a field a program written before it existed
        lacks takes its default."""
        from wse_emu.program.schema import check_fields

        values = _renamed(data)
        check_fields("options", values, cls)
        for name in ("region", "patterns"):
            if isinstance(values.get(name), list):
                values[name] = tuple(values[name])
        try:
            return cls(**values)
        except UserError as exc:
            raise ValueError(f"options: {' '.join(str(exc).split())}") from None

    def __getitem__(self, name: str):
        """``options["plan"]``, as code written when programs kept their options as a dict
        reads them (the compiler's program summary); new code reads attributes."""
        if name not in {f.name for f in fields(self)}:
            raise KeyError(name)
        return getattr(self, name)

    def pattern_names(self) -> dict[str, dict[str, str]]:
        """Per kernel role (its kind; ``experts`` for an expert strip), the pattern it runs
        in each phase: its default, or the one ``patterns`` chooses."""
        chosen = {**DEFAULT_PATTERNS, **pattern_choices(self.patterns)}
        return {role: {"decode": decode, "prefill": prefill}
                for role, (decode, prefill) in chosen.items()}


def pattern_choices(choices) -> dict[str, tuple[str, str]]:
    """Role -> (decode, prefill) pattern names of ``CompileOptions.patterns`` (strings, as
    the field's type is checked first); a choice that does not read, or a role chosen twice,
    is refused by name."""
    out = {}
    for choice in choices:
        role, sep, names = choice.partition("=")
        role, names = role.strip(), [n.strip() for n in names.split(",")]
        if not sep or role not in DEFAULT_PATTERNS or len(names) > 2 or not all(names):
            raise UserError(f"`patterns` takes ROLE=NAME or ROLE=DECODE,PREFILL, ROLE one of "
                            f"{', '.join(DEFAULT_PATTERNS)}; got {choice!r}")
        if role in out:
            raise UserError(f"`patterns` chooses the {role} pattern twice; choose it once")
        out[role] = (names[0], names[-1])
    return out


def _renamed(data: dict) -> dict:
    """The options of a program written before any kernel's pattern could be chosen, in
    today's fields: its dense strips' pair of patterns (``matrix_patterns``), a choice."""
    if not isinstance(data, dict) or "matrix_patterns" not in data:
        return data
    values = {k: v for k, v in data.items() if k != "matrix_patterns"}
    pair = data["matrix_patterns"]
    if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(n, str) for n in pair)):
        raise ValueError(f"options.matrix_patterns: must be two pattern names, got {pair!r}")
    if tuple(pair) != DEFAULT_PATTERNS["matrix"]:
        values["patterns"] = [f"matrix={pair[0]},{pair[1]}"]
    return values


def parse_region(text: str) -> tuple[int, int]:
    try:
        w, h = text.lower().split("x")
        return int(w), int(h)
    except ValueError:
        raise UserError(f"`region` must look like WxH (e.g. 377x585), got {text!r}") from None
