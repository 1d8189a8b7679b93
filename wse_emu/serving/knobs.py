"""Serving knobs, each declared once.

A knob is a field of ``ServingKnobs``, declared with ``knob(...)``: its default, the smallest
value it takes, the values the experiment tries, how the tuning table names it and how a
configuration's label shows it. The options the runtime takes (``ServeOptions``) and a tuned
configuration (``tuning.Choice``) inherit these fields; a policy names the knobs it reads
(``policies.Policy.reads``); the API's parameters, the command line's flags, the tuning's knobs
and the experiment's search space (``Space``, one field of values to try per knob, held to these
names by a test) are made from them, and every check of a value raises a ``UserError`` naming
the parameter.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from wse_emu.errors import UserError
from wse_emu.util.checks import short_repr, whole


@dataclass(frozen=True)
class KnobInfo:
    """What a knob's declaration says besides its default."""

    label: str  # as the experiment's tuning table names it: "prefill tile"
    help: str  # the command line's help text
    low: int  # the smallest value allowed
    tune: tuple  # the values the experiment tries by default
    shown: str | None = None  # how a configuration's label shows it ("tile {}"); None: its
    # policy's title shows it
    unshown: int | None = None  # a value a label leaves out (a running cap of 0: none)
    # The phase whose pools it shapes ("prefill", "decode"; None: both): on a split, the
    # hardware of that side says which values its engines use (``EngineKnobs``).
    phase: str | None = None
    # Whether it is a micro-batch's size, read off its phase's stage tables: it must lie
    # within their range (interpolated inside it, never guessed beyond).
    sizes: bool = False

    def label_part(self, value: int) -> str | None:
        if self.shown is None or value == self.unshown:
            return None
        return self.shown.format(value)


@dataclass(frozen=True)
class EngineKnobs:
    """The knob values a kind of hardware's serving engines use, which the experiment's default
    search tries on it: per knob, the values (``values``) and where tuning starts (``start``,
    the engines' own default). A knob it does not name takes its declaration's (``tune`` and
    the default). Pairs, not dicts, so that it hashes and pickles as a constant."""

    values: tuple = ()  # ((knob name, (value, ...)), ...)
    start: tuple = ()  # ((knob name, value), ...)

    def values_of(self, name: str, declared: KnobInfo) -> tuple:
        return dict(self.values).get(name, declared.tune)

    def start_of(self, name: str, default: int) -> int:
        return dict(self.start).get(name, default)


def knob(default: int, *, label: str, help: str, low: int, tune: tuple, shown: str | None = None,
         unshown: int | None = None, phase: str | None = None, sizes: bool = False):
    """A field of ``ServingKnobs`` (an integer of at least ``low``)."""
    info = KnobInfo(label, help, low, tuple(tune), shown, unshown, phase, sizes)
    for value in (default, *info.tune):
        check_value(f"the declaration of {label}", info, value)
    return field(default=default, metadata={"knob": info})


def info(f: dataclasses.Field) -> KnobInfo:
    return f.metadata["knob"]


def is_knob(f: dataclasses.Field) -> bool:
    return "knob" in f.metadata


def check_value(name: str, declared: KnobInfo, value) -> None:
    """``value`` is a whole number of at least the knob's lowest, or a UserError names
    ``name``."""
    whole(name, value, declared.low)


def check_values(name: str, declared: KnobInfo, values) -> tuple:
    """A search space's values of one knob: one or more, each valid, duplicates dropped."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise UserError(f"`{name}` must be a sequence of values, got {short_repr(values)}")
    values = tuple(values)
    if not values:
        raise UserError(f"`{name}` needs at least one value")
    for value in values:
        check_value(name, declared, value)
    return tuple(dict.fromkeys(values))


@dataclass(frozen=True, kw_only=True)
class ServingKnobs:
    """Every serving knob, in the order the experiment tunes them (and labels show them).
    Keyword-only, so that a class inheriting them may add fields without defaults after them;
    each value is checked on construction, by its name."""

    prefill_tile: int = knob(
        64, label="prefill tile", low=1, tune=(8, 16, 32, 64, 128, 256), shown="tile {}",
        phase="prefill", sizes=True,
        help="tokens per prefill micro-batch: a prompt streams through the stages in tiles of "
             "this many, so that it fills the pipeline like a flow shop")
    token_budget: int = knob(
        256, label="chunk budget", low=1, tune=(16, 32, 64, 128, 256, 512), phase="prefill",
        sizes=True,
        help="chunked prefill: tokens per micro-batch, the ready decode tokens first and the "
             "next prompt's after them")
    chunk_prompts: int = knob(
        1, label="prompts per chunk", low=1, tune=(1,), shown="{} prompts", unshown=1,
        phase="prefill",
        help="chunked prefill: prompts a chunk may take, each to its end but the last, while "
             "the budget lasts (vLLM, SGLang and TensorRT-LLM pack several; 1 by default, as "
             "the published wafer results were tuned)")
    interleave: int = knob(
        1, label="interleave ratio", low=1, tune=(1, 2, 4),
        help="interleaved: decode micro-batches per prefill tile when both wait")
    max_running: int = knob(
        0, label="running cap", low=0, tune=(0, 32, 128), shown="cap {}", unshown=0,
        phase="decode",
        help="sequences holding KV at once in a colocated or decode region (0: no cap)")
    batch_limit: int = knob(
        64, label="decode batch limit", low=1, tune=(16, 32, 64), shown="batch {}",
        phase="decode", sizes=True, help="sequences per decode micro-batch")

    def __post_init__(self):
        for f in knob_fields():
            check_value(f.name, info(f), getattr(self, f.name))


def knob_fields() -> tuple[dataclasses.Field, ...]:
    """Every serving knob, once, in the order of ``ServingKnobs``."""
    return dataclasses.fields(ServingKnobs)


KNOB_NAMES = tuple(f.name for f in knob_fields())
_DECLARED = {f.name: info(f) for f in knob_fields()}


def knob_info(name: str) -> KnobInfo:
    """The declaration of knob ``name``."""
    return _DECLARED[name]


def knobs_of(settings) -> ServingKnobs:
    """The knob values of ``settings`` (anything with them as attributes: ``ServeOptions``, a
    tuning ``Choice``)."""
    return ServingKnobs(**{name: getattr(settings, name) for name in KNOB_NAMES})


def _position(name: str) -> int:
    return KNOB_NAMES.index(name)


# Where each knob sits in a policy's packed knobs (``policies.Policy.packed``), for the
# compiled dispatches, which read that array by position. Numba's cache keeps these numbers
# as constants of a dispatch and renews it only when the dispatch's own file changes: knobs
# reordered here need ``policies.py`` touched too (the twin tests, which read knobs by name
# on the plain loop, catch a stale cache).
PREFILL_TILE = _position("prefill_tile")
TOKEN_BUDGET = _position("token_budget")
CHUNK_PROMPTS = _position("chunk_prompts")
INTERLEAVE = _position("interleave")
MAX_RUNNING = _position("max_running")
BATCH_LIMIT = _position("batch_limit")
