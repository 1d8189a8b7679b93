"""AIConfigurator's own answer to the question our experiment answers on GPU pools: its `cli
default` (aggregated against disaggregated serving of a model on N GPUs at an ISL, an OSL and
TTFT and TPOT targets), for a check of our serving runtime against a peer's. It needs the
planner itself (``aiconfigurator`` on PyPI, the ``peer`` extra), beside the ``gpu`` extra's
databases; without it the check is refused by name.

Its answer comes from its static model of a steady state; ours from serving requests one by
one (``docs/serving.md`` says where the two differ).
"""

from __future__ import annotations

import csv
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from wse_emu.errors import UserError
from wse_emu.models.spec import ModelSpec
from wse_emu.pools.kinds.gpu import BACKEND, GPUS, MODELS


@dataclass(frozen=True)
class PeerAnswer:
    """One plan's best as AIConfigurator reports it."""

    plan: str  # agg or disagg
    tokens_per_s_per_gpu: float
    tokens_per_s_per_user: float
    configuration: str  # its parallelism and batch, in its own words
    # Disaggregated: its split as our pools name it (prefill, decode: ``h200x4tp1``) and its
    # decode batch, to serve our runtime at its own configuration.
    prefill_pool: str | None = None
    decode_pool: str | None = None
    decode_batch: int | None = None


def aiconfigurator_default(model: ModelSpec, gpu: str, gpus: int, isl: int, osl: int,
                           ttft_s: float, tpot_s: float) -> tuple[dict[str, PeerAnswer], str]:
    """AIConfigurator's best aggregated and disaggregated configurations (plan -> answer) and
    the version that gave them."""
    exe = shutil.which("aiconfigurator")
    if exe is None:
        raise UserError("the check against AIConfigurator needs its planner: "
                        "pip install -e '.[gpu,peer]'")
    if model.name not in MODELS or gpu not in GPUS:
        raise UserError(f"AIConfigurator's database describes {', '.join(MODELS)} on "
                        f"{', '.join(GPUS)}; got {model.name} on {gpu}")
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run(
            [exe, "cli", "default", "--model-path", MODELS[model.name], "--total-gpus",
             str(gpus), "--system", GPUS[gpu], "--backend", BACKEND, "--isl", str(isl),
             "--osl", str(osl), "--ttft", f"{ttft_s * 1e3:g}", "--tpot", f"{tpot_s * 1e3:g}",
             "--log-level", "ERROR", "--no-color", "--save-dir", tmp],
            capture_output=True, text=True)
        tables = {plan: next(Path(tmp).rglob(f"{plan}/best_config_topn.csv"), None)
                  for plan in ("agg", "disagg")}
        if done.returncode or not all(tables.values()):
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise UserError(f"AIConfigurator gave no answer: {last}")
        answers = {plan: _best(plan, path, gpu) for plan, path in tables.items()}
    return answers, f"aiconfigurator {metadata.version('aiconfigurator')}"


def _best(plan: str, path: Path, gpu: str) -> PeerAnswer:
    """The first row of its table of best configurations (it sorts them best first)."""
    with path.open() as f:
        row = next(csv.DictReader(f))
    speeds = float(row["tokens/s/gpu"]), float(row["tokens/s/user"])
    if plan == "agg":
        config = f"tp{row['tp']}, batch {row['bs']}, {row['ctx_tokens']} context tokens per step"
        return PeerAnswer(plan, *speeds, config)
    config = (f"{row['(p)workers']} x tp{row['(p)tp']} prefill, {row['(d)workers']} x "
              f"tp{row['(d)tp']} decode at batch {row['(d)bs']}")

    def pool(side: str) -> str:
        tp = int(row[f"({side})tp"])
        return f"{gpu}x{int(row[f'({side})workers']) * tp}tp{tp}"
    return PeerAnswer(plan, *speeds, config, pool("p"), pool("d"), int(row["(d)bs"]))
