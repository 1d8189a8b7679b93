"""Drawing a run directory: its figures and a self-contained report.html, with the run's
configuration and headline numbers."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from wse_emu.fmt import number, seconds, si, with_unit
from wse_emu.visualize.figures import draw_all
from wse_emu.visualize.report import write_report
from wse_emu.visualize.rundir import load_run

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
    if run.sweep:
        return f"wse-emu sweep {run.sweep['name']}"
    data = run.experiment or run.metrics or run.inspect
    return (f"wse-emu {run.kind}: {data.get('model')} on "
            f"{data.get('cluster') or data.get('fabric')}")


def _config(run) -> list[tuple[str, object]]:
    p = run.program
    rows: list[tuple[str, object]] = [("run directory", run.path.name), ("kind", run.kind)]
    if p is not None:
        rows += [("model", p.model.name), ("fabric", p.fabric.name), ("systems", p.systems),
                 ("plan", p.options.plan),
                 ("regions", ", ".join(f"{r.name} ({r.role}, {r.pes:,} PEs, "
                                       f"{len(r.stage_ids)} stages)" for r in p.regions))]
    if run.sweep:
        w = run.sweep
        rows += [("point", w["point"]), ("base", ", ".join(f"{k} {v}" for k, v in
                                                           w["base"].items())),
                 ("axes", "; ".join(f"{k}: {', '.join(map(str, v))}" for k, v in
                                    w["axes"].items())),
                 ("points", f"{len(w['rows'])} done, {sum('error' in r for r in w['rows'])} "
                            "failed")]
    e = run.experiment
    if e and "rungs" in e:
        speeds = ", ".join(f"{r['user_speed']:,.0f}" for r in e["rungs"])
        rows += [("model", e["model"]), ("cluster", e["cluster"]), ("workload", e["workload"]),
                 ("targets", f"p90 TTFT <= {seconds(e['ttft_p90_s'])}; p90 TPOT <= 1 / speed "
                             f"at speeds {speeds} tokens/s per user")]
    elif e and "sensitivity" in e:
        rows += [("model", e["model"]), ("fabric", e["fabric"]), ("workload", e["workload"]),
                 ("varied", f"{e['vary']} ({e['description']}): "
                            + ", ".join(number(r["value"], 6) for r in e["sensitivity"]))]
    elif e:
        rows += [("model", e["model"]), ("cluster", e["cluster"]), ("workload", e["workload"]),
                 ("requests per run", e["requests_per_run"]),
                 ("targets", f"p90 TTFT <= {seconds(e['targets']['ttft_p90_s'])}, p90 TPOT "
                             f"<= {seconds(e['targets']['tpot_p90_s'])}, >= "
                             f"{e['targets']['attainment']:.0%} of requests meeting both")]
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
    head = e.get("headline")
    if head:
        ratio = head["capacity_ratio"].get("ratio")
        shown = ratio if isinstance(ratio, str) else ("-" if ratio is None else f"{ratio:.2f}x")
        rows.append((f"capacity at {head['user_speed']:,.0f} tokens/s per user",
                     ", ".join(f"{p} {with_unit(v, 'tok/s')} per system"
                               for p, v in head["capacity_per_system"].items())
                     + f"; disaggregated / colocated {shown}"))
    for c in e.get("final") or e.get("configurations", []):
        rows.append((c["configuration"],
                     f"goodput (highest rate met) {number(c.get('max_rate_per_system', 0))} "
                     f"requests/s per system; next rate fails on {c['limited_by']}"))
    for v in e.get("sensitivity", []):
        if "error" in v:
            text = v["error"]
        elif v["goodput_ratio"] is None:
            text = "no colocated configuration met the targets"
        else:
            text = f"disaggregated / colocated goodput {v['goodput_ratio']:.2f}x"
        rows.append((f"{e['vary']} = {number(v['value'], 6)}", text))
    cmp_ = e.get("comparison", {})
    if cmp_.get("goodput_ratio") is not None:
        rows.append(("disaggregated / colocated goodput (highest rate met)",
                     f"{cmp_['goodput_ratio']:.2f}x"))
        rows += [("why", reason) for reason in cmp_.get("reasons", [])]
    if run.inspect:
        i = run.inspect
        rows += [("parameters", f"{si(i['params']['total'])}, {si(i['params']['active'])} "
                                "used per token"),
                 ("weights as stored", si(i["params"]["stored_bytes"], "B")),
                 ("whole step", f"{si(i['total']['flops'], 'FLOP')}, "
                                f"{si(i['total']['bytes'], 'B')} moved, "
                                f"{number(i['total']['intensity'])} FLOP/B")]
    m = run.metrics
    for key, label, fmt in (("requests", "requests", lambda v: f"{v:,}"),
                            ("output_tokens_per_s", "output tokens/s", si),
                            ("requests_per_s", "requests/s", number),
                            ("slo_attainment", "requests meeting both targets",
                             lambda v: f"{v:.1%}"),
                            ("goodput_requests_per_s", "on target per second of the run",
                             number)):
        if key in m:
            rows.append((label, fmt(m[key])))
    for key, label in (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("itl_s", "inter-token latency"),
                       ("e2e_s", "end to end")):
        if key in m:
            rows.append((f"{label} p50 / p90 / p99",
                         " / ".join(seconds(m[key][q]) for q in ("p50", "p90", "p99"))))
    return rows
