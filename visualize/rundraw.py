"""Drawing a run directory: its figures and a self-contained report.html, with the run's
configuration and headline numbers."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from visualize.figures import draw_all
from visualize.report import write_report
from visualize.rundir import load_run


def draw_run(path: Path, what, formats=("png",), system: int = 0) -> Path:
    """Draw ``path``'s figures and report; they replace earlier ones only once all are drawn."""
    run = load_run(path)
    staging = Path(tempfile.mkdtemp(prefix=".viz-", dir=path))
    try:
        figures_dir = staging / "figures"
        figures_dir.mkdir()
        figures = draw_all(run, figures_dir, what, formats, system)
        report = write_report(staging / "report.html", _title(run), _config(run),
                              _metrics(run), figures)
        if (path / "figures").exists():
            shutil.rmtree(path / "figures")
        figures_dir.replace(path / "figures")
        report.replace(path / "report.html")
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return path / "report.html"


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
