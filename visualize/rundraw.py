"""Drawing a run directory: its figures and a self-contained report.html, with the run's
configuration and headline numbers."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from wse_emu.errors import UserError
from wse_emu.experiments.comparison import ExperimentReport, VaryReport
from wse_emu.experiments.drift import DriftReport
from wse_emu.experiments.frontier import FrontierReport
from wse_emu.rundir.read import load_run
from wse_emu.util.atomic import WriteError, write_text
from wse_emu.util.configfile import regular_file
from wse_emu.util.fmt import number, seconds, si, with_unit
from wse_emu.visualize.figures import check_kinds, draw_all
from wse_emu.visualize.report import write_report

CAPTIONS = "captions.json"  # in figures/: every figure the report shows, in order, with its caption


def draw_run(path: Path, what, formats=("png",), system: int = 0) -> Path:
    """Draw ``path``'s figures of the kinds ``what`` and its report. Figures drawn before, of
    other kinds, stay and stay in the report; the new ones replace earlier ones only once all
    are drawn."""
    what = check_kinds(what)
    run = load_run(path)
    final = path / "figures"
    try:
        staging = Path(tempfile.mkdtemp(prefix=".viz-", dir=path))
    except OSError as exc:
        raise WriteError(final, str(exc.strerror or exc)) from None
    try:
        figures = draw_all(run, staging, what, formats, system)
        final.mkdir(exist_ok=True)
        drawn = {f.name: caption for f, caption in figures}
        shown = [(name, caption) for name, caption in _shown(final)
                 if name not in drawn and (final / name).exists()] + list(drawn.items())
        for item in staging.iterdir():
            item.replace(final / item.name)
        write_text(final / CAPTIONS, json.dumps(shown, indent=1))
        report = write_report(path / "report.html", _title(run), _config(run), _metrics(run),
                              [(final / name, caption) for name, caption in shown])
    except OSError as exc:  # making figures/ or moving into it (a file is written whole)
        raise WriteError(final, str(exc.strerror or exc)) from None
    except WriteError as exc:
        if staging in exc.path.parents:  # the name it was to have, not the staging folder's
            raise WriteError(final / exc.path.relative_to(staging), exc.reason) from None
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return report


def _shown(figures: Path) -> list:
    """The (file, caption) pairs the report showed last time, if it said."""
    try:
        return [tuple(pair) for pair in
                json.loads(regular_file(figures / CAPTIONS).read_text())]
    except (OSError, ValueError, UserError):  # no captions to go by: every figure shown
        return []


def _title(run) -> str:
    p = run.program
    if p is not None:
        return f"wse-emu {run.kind}: {p.model.name} on {p.systems} x {p.fabric.name}"
    if run.sweep is not None:
        return f"wse-emu sweep {run.sweep.name}"
    if run.experiment is not None:
        e = run.experiment
        where = e.fabric if isinstance(e, VaryReport) else e.cluster
        return f"wse-emu {run.kind}: {e.model} on {where}"
    if run.metrics is not None:
        return f"wse-emu {run.kind}: {run.metrics.model} on {run.metrics.cluster}"
    return f"wse-emu {run.kind}: {run.inspect.get('model')} on {run.inspect.get('fabric')}"


def _config(run) -> list[tuple[str, object]]:
    p = run.program
    rows: list[tuple[str, object]] = [("run directory", run.path.name), ("kind", run.kind)]
    if p is not None:
        rows += [("model", p.model.name), ("fabric", p.fabric.name), ("systems", p.systems),
                 ("plan", p.options.plan),
                 ("regions", ", ".join(f"{r.name} ({r.role}, {r.pes:,} PEs, "
                                       f"{len(r.stage_ids)} stages)" for r in p.regions))]
    if run.sweep is not None:
        w, done = run.sweep, run.sweep_rows
        rows += [("point", w.point), ("base", ", ".join(f"{k} {v}" for k, v in w.base.items())),
                 ("axes", "; ".join(f"{k}: {', '.join(map(str, v))}" for k, v in
                                    w.axes.items())),
                 ("points", f"{len(done)} done, {sum(r.failed for r in done)} failed")]
    e = run.experiment
    if isinstance(e, DriftReport):
        t = e.targets
        rows += [("model", e.model), ("cluster", e.cluster), ("tuned on", e.tuned_on),
                 ("served on", ", ".join(r.workload for r in e.rows[1:])),
                 ("targets", f"{t.at} TTFT <= {seconds(t.ttft_s)}, {t.at} TPOT "
                             f"<= {seconds(t.tpot_s)}")]
    elif isinstance(e, FrontierReport):
        speeds = ", ".join(f"{r.user_speed:,.0f}" for r in e.rungs)
        rows += [("model", e.model), ("cluster", e.cluster), ("workload", e.workload),
                 ("targets", f"p90 TTFT <= {seconds(e.ttft_p90_s)}; p90 TPOT <= 1 / speed "
                             f"at speeds {speeds} tokens/s per user")]
    elif isinstance(e, VaryReport):
        rows += [("model", e.model), ("fabric", e.fabric), ("workload", e.workload),
                 ("varied", f"{e.vary} ({e.description}): "
                            + ", ".join(number(r.value, 6) for r in e.sensitivity))]
    elif e is not None:
        t = e.targets
        rows += [("model", e.model), ("cluster", e.cluster), ("workload", e.workload),
                 ("requests per run", e.requests_per_run),
                 ("targets", f"{t.at} TTFT <= {seconds(t.ttft_s)}, {t.at} TPOT "
                             f"<= {seconds(t.tpot_s)}, >= "
                             f"{t.attainment:.0%} of requests meeting both")]
    if run.inspect:
        i = run.inspect
        rows += [("model", i["model"]), ("fabric", i["fabric"]),
                 ("step", ", ".join(f"{k} {v}" for k, v in i["workload"].items()))]
    if run.results.get("step"):
        rows.append(("simulated step", ", ".join(f"{k} {v}" for k, v in
                                                  run.results["step"].items())))
        rows.append(("region simulated", run.results.get("region")))
    return rows


def _metrics(run) -> list[tuple[str, object]]:
    """The run's key numbers, formatted as the command line prints them."""
    r = run.results
    shown = {"step_cycles": ("step", lambda v: f"{v:,.0f} cycles"),
             "step_seconds": ("step time", seconds),
             "tokens_per_s_alone": ("tokens/s, one micro-batch alone",
                                    lambda v: with_unit(v, "tok/s")),
             "tokens_per_s_pipelined": ("tokens/s, pipeline full",
                                        lambda v: with_unit(v, "tok/s")),
             "compute_utilization": ("compute utilization", lambda v: f"{v:.1%}"),
             "link_utilization": ("link utilization", lambda v: f"{v:.1%}")}
    rows = [(label, fmt(r[key])) for key, (label, fmt) in shown.items() if key in r]
    # The experiment: each plan's best as compared (every configuration tuned, before the
    # confirming runs existed).
    e = run.experiment
    head = e.headline if isinstance(e, FrontierReport) else None
    if head:
        ratio = head.capacity_ratio.ratio
        shown = ratio if isinstance(ratio, str) else ("-" if ratio is None else f"{ratio:.2f}x")
        rows.append((f"capacity at {head.user_speed:,.0f} tokens/s per user",
                     ", ".join(f"{p} {with_unit(v, 'tok/s')} per system"
                               for p, v in head.capacity_per_system.items())
                     + f"; disaggregated / colocated {shown}"))
    if isinstance(e, DriftReport):
        for r in e.rows:
            rows.append((r.workload, f"disaggregated / colocated {_mean(r.fixed_ratio)} as "
                                     f"tuned on {e.tuned_on}, {_mean(r.retuned_ratio)} "
                                     "retuned"))
    if isinstance(e, VaryReport):
        for v in e.sensitivity:
            if v.error is not None:
                text = v.error
            elif v.goodput_ratio is None:
                text = "no colocated configuration met the targets"
            else:
                text = f"disaggregated / colocated goodput {v.goodput_ratio:.2f}x"
            rows.append((f"{e.vary} = {number(v.value, 6)}", text))
    if isinstance(e, ExperimentReport):
        for c in e.rows().values():
            rows.append((c.configuration,
                         f"goodput (highest rate met) {number(c.max_rate_per_system)} "
                         f"requests/s per system; next rate fails on {c.limited_by}"))
        if e.comparison.goodput_ratio is not None:
            rows.append(("disaggregated / colocated goodput (highest rate met)",
                         f"{e.comparison.goodput_ratio:.2f}x"))
            rows += [("why", reason) for reason in e.comparison.reasons]
    if run.inspect:
        i = run.inspect
        rows += [("parameters", f"{si(i['params']['total'])}, {si(i['params']['active'])} "
                                "used per token"),
                 ("weights as stored", si(i["params"]["stored_bytes"], "B")),
                 ("whole step", f"{si(i['total']['flops'], 'FLOP')}, "
                                f"{si(i['total']['bytes'], 'B')} moved, "
                                f"{number(i['total']['intensity'])} FLOP/B")]
    if run.metrics is not None:
        m = run.metrics.metrics
        rows += [("requests", f"{m.requests:,}"), ("output tokens/s", si(m.output_tokens_per_s)),
                 ("requests/s", number(m.requests_per_s)),
                 ("requests meeting both targets", "no targets given"
                  if m.slo_attainment is None else f"{m.slo_attainment:.1%}"),
                 ("on target per second of the run", "no targets given"
                  if m.goodput_requests_per_s is None else number(m.goodput_requests_per_s))]
        for times, label in ((m.ttft_s, "TTFT"), (m.tpot_s, "TPOT"),
                             (m.itl_s, "inter-token latency"), (m.e2e_s, "end to end")):
            rows.append((f"{label} p50 / p90 / p99",
                         " / ".join(seconds(t) for t in (times.p50, times.p90, times.p99))))
    return rows


def _mean(iv: dict) -> str:
    """A ratio's mean over draws, as the table shows it ("-": none)."""
    return "-" if iv.get("mean") is None else f"{iv['mean']:.2f}x"
