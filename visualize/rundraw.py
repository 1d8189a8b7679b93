"""Drawing a run directory: its figures and a self-contained report.html, with the run's
configuration and headline numbers."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from visualize.figures import draw_all
from visualize.report import write_report
from visualize.rundir import load_run

CAPTIONS = "captions.json"  # in figures/: every figure the report shows, in order, with its caption


def draw_run(path: Path, what, formats=("png",), system: int = 0) -> Path:
    """Draw ``path``'s figures of the kinds ``what`` and its report. Figures drawn before, of
    other kinds, stay and stay in the report; the new ones replace earlier ones only once all
    are drawn."""
    run = load_run(path)
    staging = Path(tempfile.mkdtemp(prefix=".viz-", dir=path))
    try:
        figures = draw_all(run, staging, what, formats, system)
        final = path / "figures"
        final.mkdir(exist_ok=True)
        drawn = {f.name: caption for f, caption in figures}
        shown = [(name, caption) for name, caption in _shown(final)
                 if name not in drawn and (final / name).exists()] + list(drawn.items())
        for item in staging.iterdir():
            item.replace(final / item.name)
        (final / CAPTIONS).write_text(json.dumps(shown, indent=1))
        report = write_report(path / "report.html", _title(run), _config(run), _metrics(run),
                              [(final / name, caption) for name, caption in shown])
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return report


def _shown(figures: Path) -> list:
    """The (file, caption) pairs the report showed last time, if it said."""
    try:
        return [tuple(pair) for pair in json.loads((figures / CAPTIONS).read_text())]
    except (OSError, ValueError):
        return []


def _title(run) -> str:
    p = run.program
    if p is not None:
        return f"wse-emu {run.kind}: {p.model.name} on {p.systems} x {p.fabric.name}"
    data = run.experiment or run.metrics
    return (f"wse-emu {run.kind}: {data.get('model')} on "
            f"{data.get('cluster') or data.get('fabric')}")


def _config(run) -> list[tuple[str, object]]:
    p = run.program
    rows: list[tuple[str, object]] = [("run directory", run.path.name), ("kind", run.kind)]
    if p is not None:
        rows += [("model", p.model.name), ("fabric", p.fabric.name), ("systems", p.systems),
                 ("plan", p.options.get("plan")),
                 ("regions", ", ".join(f"{r.name} ({r.role}, {r.pes:,} PEs, "
                                       f"{len(r.stage_ids)} stages)" for r in p.regions))]
    e = run.experiment
    if e and "sensitivity" in e:
        rows += [("model", e["model"]), ("fabric", e["fabric"]), ("workload", e["workload"]),
                 ("varied", f"{e['vary']} ({e['description']}): "
                            + ", ".join(f"{r['value']:g}" for r in e["sensitivity"]))]
    elif e:
        rows += [("model", e["model"]), ("cluster", e["cluster"]), ("workload", e["workload"]),
                 ("requests per run", e["requests_per_run"]),
                 ("targets", f"p90 TTFT <= {e['targets']['ttft_p90_s']} s, p90 TPOT <= "
                             f"{e['targets']['tpot_p90_s']} s, attainment >= "
                             f"{e['targets']['attainment']}")]
    if run.results.get("step"):
        rows.append(("simulated step", ", ".join(f"{k} {v}" for k, v in
                                                  run.results["step"].items())))
        rows.append(("region simulated", run.results.get("region")))
    return rows


def _metrics(run) -> list[tuple[str, object]]:
    r = run.results
    rows = [(k.replace("_", " "), r[k]) for k in
            ("step_cycles", "step_seconds", "tokens_per_s_alone", "tokens_per_s_pipelined",
             "compute_utilization", "link_utilization") if k in r]
    # The experiment: each plan's best as compared (every configuration tuned, before the
    # confirming runs existed).
    e = run.experiment
    for c in e.get("final") or e.get("configurations", []):
        rows.append((c["configuration"], f"goodput (max rate met) {c['max_rate_per_s']:.4g}/s, "
                     f"on target per makespan {c.get('goodput_requests_per_s', 0):.4g}/s; "
                     f"next rate fails on {c['limited_by']}"))
    for r in run.experiment.get("sensitivity", []):
        if "error" in r:
            shown = r["error"]
        elif r["goodput_ratio"] is None:
            shown = "no colocated configuration met the targets"
        else:
            shown = f"disaggregated / colocated goodput {r['goodput_ratio']:.3g}"
        rows.append((f"{run.experiment['vary']} = {r['value']:g}", shown))
    cmp_ = run.experiment.get("comparison", {})
    if cmp_.get("goodput_ratio") is not None:
        rows.append(("disaggregated / colocated goodput (max rate met)", cmp_["goodput_ratio"]))
        rows += [("why", reason) for reason in cmp_.get("reasons", [])]
    m = run.metrics
    for key in ("requests", "output_tokens_per_s", "requests_per_s", "slo_attainment",
                "goodput_requests_per_s"):
        if key in m:
            rows.append((key.replace("_", " "), m[key]))
    for key in ("ttft_s", "tpot_s", "e2e_s"):
        if key in m:
            rows.append((f"{key[:-2].upper()} p50 / p90 / p99 (s)",
                         " / ".join(f"{m[key][q]:.4g}" for q in ("p50", "p90", "p99"))))
    return rows
