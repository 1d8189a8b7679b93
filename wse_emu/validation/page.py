"""The checks' outcomes as text: the table ``wse-emu validate`` prints, and the Markdown of
docs/accuracy.md (``wse-emu validate --page``)."""

from __future__ import annotations

from wse_emu.util.fmt import narrow_table
from wse_emu.validation.checks import NOT_RUN, Outcome


def _number(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.3g}" if abs(value) < 100 else f"{value:,.0f}"


def table(outcomes: list[Outcome]) -> str:
    """One row per check: what, the reference's value, ours, the ratio, the band, the verdict;
    then a line on how many passed."""
    rows = []
    for o in outcomes:
        r = o.check.reference
        rows.append([o.check.name, f"{_number(r.value)} {r.unit}", _number(o.ours),
                     "-" if o.ratio is None else f"{o.ratio:.3f}",
                     f"{o.check.band[0]:g} to {o.check.band[1]:g}",
                     o.status])
    text = narrow_table(["check", "published", "ours", "ours / published", "band", "verdict"],
                        rows, "lrrrrl")
    failed = [o.check.name for o in outcomes if o.status == "fail"]
    counts = {s: sum(o.status == s for o in outcomes) for s in ("pass", "fail", NOT_RUN)}
    summary = (f"{counts['pass']} passed, {counts['fail']} failed"
               + (f", {counts[NOT_RUN]} not run" if counts[NOT_RUN] else "")
               + (f"; out of band: {', '.join(failed)}" if failed else "")
               + "".join(f"\n{o.check.name}: not run, {o.why_not_run}" for o in outcomes
                         if o.status == NOT_RUN))
    return f"{text}\n\n{summary}"


def markdown(outcomes: list[Outcome], prefill_tiles: list[dict] | None = None,
             trn2_fits: list[dict] | None = None) -> str:
    """docs/accuracy.md: the table, then each check's reference, what ours is and why its
    band is what it is; with ``prefill_tiles`` (``waferllm.prefill_by_tile``), what is known
    of the prefill's departure from WaferLLM's; with ``trn2_fits`` (``trn2.transfer``), the
    Trainium2 efficiencies AWS's measurements give."""
    lines = ["# Accuracy", "",
             "Every published measurement the emulator is compared against, with the "
             "emulator's figure from the code as it is. This page is written by `wse-emu "
             "validate --page > docs/accuracy.md`; `wse-emu validate` prints the table and "
             "exits 1 when a check leaves its band. The fast checks run in the test suite "
             "(`tests/validation/`), the others in the slow tier. A check whose figure needs "
             "an optional extra runs where it is installed and is shown as not run where it "
             "is not.", "",
             "| check | published | ours | ours / published | band | verdict | speed |",
             "|---|---|---|---|---|---|---|"]
    for o in outcomes:
        r = o.check.reference
        lines.append(f"| {o.check.name} | {_number(r.value)} {r.unit} | {_number(o.ours)} | "
                     + ("-" if o.ratio is None else f"{o.ratio:.3f}")
                     + f" | {o.check.band[0]:g} to {o.check.band[1]:g} | {o.status} | "
                     f"{o.check.speed} |")
    lines += ["", "## The checks", ""]
    for o in outcomes:
        c, r = o.check, o.check.reference
        lines += [f"### {c.name}", "",
                  f"- **Reference**: {r.measured}: {_number(r.value)} {r.unit} ({r.source}; "
                  f"{r.date}).",
                  f"- **Ours**: {c.ours}"
                  + (f" (with the {c.extra} extra)." if c.extra else "."),
                  f"- **Band**: {c.band[0]:g} to {c.band[1]:g}: {c.why_band}.", ""]
    if prefill_tiles:
        lines += _prefill_section(prefill_tiles)
    if trn2_fits:
        lines += _trn2_section(trn2_fits)
    return "\n".join(lines).rstrip() + "\n"


def _trn2_section(rows: list[dict]) -> list[str]:
    """The efficiencies at which our Trn2 roofline meets AWS's measurements, and how far
    one model's carry to the other."""
    first, other = rows[0], rows[1]
    return [
        "", "## Trainium2: efficiencies from AWS's measurements", "",
        "The efficiencies at which the trn2 roofline (one copy over all 16 chips, as AWS ran "
        "it) gives each measured TTFT and ITL (`wse_emu/validation/trn2.py`, `fitted`: each "
        "solved with the other held, in turn), and the TTFT and ITL the first model's "
        "efficiencies predict for each, over what was measured:", "",
        "| model | matrix efficiency (from TTFT) | memory efficiency (from ITL) | TTFT predicted / "
        "measured | ITL predicted / measured |", "|---|---|---|---|---|",
        *(f"| {r['model']} | {r['matrix_efficiency']:.3f} | {r['memory_efficiency']:.3f} | "
          f"{r['ttft_ratio']:.2f} | {r['itl_ratio']:.2f} |" for r in rows), "",
        f"The `trn2-measured` preset takes {first['model']}'s ({first['matrix_efficiency']:.3f} "
        f"and {first['memory_efficiency']:.3f}). They do not carry to {other['model']}: its "
        f"times come out {other['ttft_ratio']:.2f}x and {other['itl_ratio']:.2f}x too long, "
        f"its own efficiencies "
        f"{other['matrix_efficiency'] / first['matrix_efficiency']:.1f} and "
        f"{other['memory_efficiency'] / first['memory_efficiency']:.1f} times as high. One "
        "request at a time, "
        "a fixed cost per request and per step (the server, the collectives' latency over "
        "64 cores, the prompt's padding to its bucket) weighs more the smaller the model, "
        "and a single efficiency cannot say so. For a model as small as Llama-3.1-8B the "
        "70B efficiencies are likely too high at batch 1 and too low at the batches serving "
        "runs; the roofline (`trn2`) stays the bound, and answers are given with both."]


def _prefill_section(rows: list[dict]) -> list[str]:
    """Our prefill against WaferLLM's by tile size, and what it says."""
    one = rows[0]
    best = max(rows, key=lambda r: r["ratio"])
    return [
        "## Prefill against WaferLLM's, by tile size", "",
        "The same prefill of a 4,096-token prompt (one layer on 480x480 cores of WSE-2, "
        "32 times), in tiles of each size:", "",
        "| tiles | tokens per tile | tokens/s | ours / WaferLLM's | PE-cycles computing |",
        "|---|---|---|---|---|",
        *(f"| {r['tiles']} | {r['tile_tokens']:,} | {r['tokens_per_s']:,.0f} | "
          f"{r['ratio']:.2f} | {r['compute_utilization']:.1%} |" for r in rows), "",
        f"In one tile, as WaferLLM's MeshGEMM computes it, ours is {1 - one['ratio']:.0%} "
        f"slower than measured; in {best['tiles']} tiles of {best['tile_tokens']:,} tokens, "
        f"{best['ratio'] - 1:.0%} faster. The hardware parameters are the same in every row: "
        "what differs is the mapping. WaferLLM runs each operation of a layer over the whole "
        "grid in turn; our compiler lays a layer's operations out side by side, each in a "
        "strip of the region, as a pipeline that tiles stream through. One tile leaves most "
        f"strips idle ({one['compute_utilization']:.0%} of PE-cycles computing); tiles "
        "streaming keep more of them busy at once. So the departure is the mappings', and "
        "runs both ways: with one tile ours is slower than the measurement, with the tiles "
        "serving streams (`wse-emu run` uses 4 by default) faster. Neither says the hardware "
        "model is wrong, and none of the rows fits a parameter to the paper. Where prefill "
        "binds, the answer leans on it: `experiment frontier` reads its headline again with "
        "prefill step times scaled (`--step-scales`)."]
