"""``wse-emu compile``: map a model onto a cluster of wafers and report how it lands."""

from __future__ import annotations

from wse_emu import api
from wse_emu.cli.fabric_args import add_fabric_args, fabric_from_args
from wse_emu.compiler.options import DEFAULT_PATTERNS, parse_region
from wse_emu.models.load import load_model
from wse_emu.models.routing import routing_for
from wse_emu.models.spec import WEIGHT_FORMATS, ModelSpec, stored_as
from wse_emu.program.format import WaferProgram
from wse_emu.rundir.directory import write_run_dir
from wse_emu.rundir.write import write_compiled
from wse_emu.util.fmt import count, gb, seconds, si, table


def add_format_args(p) -> None:
    formats = list(WEIGHT_FORMATS)
    p.add_argument("--weight-format", choices=formats, metavar="FORMAT",
                   help="store the weight matrices as FORMAT: " + ", ".join(formats)
                   + " (default: as the model's file or checkpoint says)")
    p.add_argument("--expert-weight-format", choices=formats, metavar="FORMAT",
                   help="a mixture of experts: store the experts' matrices as FORMAT")


def model_from_args(args, model: ModelSpec | None = None) -> ModelSpec:
    """The command's model (or ``model``, already loaded) in the stored formats it asks for."""
    return stored_as(model or load_model(args.model), args.weight_format,
                     args.expert_weight_format)


def add_routing_args(p) -> None:
    """A mixture of experts' routing in the steps a command times (``routing_for``)."""
    p.add_argument("--routing", default="uniform", metavar="uniform|skewed:S",
                   help="a mixture of experts: how a timed step's tokens pick their experts "
                        "(skewed: Zipf popularity with exponent S; default uniform)")
    p.add_argument("--routing-seed", type=int, default=0, help="seed of the drawn routing")


def add_cluster_args(p) -> None:
    add_fabric_args(p)
    add_format_args(p)
    p.add_argument("--systems", type=int, default=1, help="systems (wafers) in the cluster")
    p.add_argument("--plan", choices=["colocated", "disaggregated"], default="colocated")
    share = p.add_mutually_exclusive_group()
    share.add_argument("--prefill-share", type=float, help="disaggregated: prefill share of "
                       "every wafer's columns (default 0.5)")
    share.add_argument("--prefill-systems", type=int, help="disaggregated: systems for prefill")
    p.add_argument("--region", metavar="WxH",
                   help="region rectangle WxH for replicas (default: automatic)")
    p.add_argument("--layers-per-stage", type=int, help="layers per pipeline stage "
                   "(default: the fewest that map)")
    p.add_argument("--no-optimize", action="store_true", help="keep the baseline placement")
    p.add_argument("--seed", type=int, default=0, help="placement optimizer seed")
    add_routing_args(p)
    p.add_argument("--draft", metavar="MODEL|mtp",
                   help="speculative decoding's draft, compiled beside the target on a strip "
                        "of the wafer holding each replica's last stage: a model preset, YAML "
                        "or config.json of the target's vocabulary, or mtp (a one-layer head "
                        "of the target's architecture)")
    p.add_argument("--draft-columns", type=int, metavar="N",
                   help="with --draft: its strip's width in columns (default: the narrowest "
                        "that holds it; a wider one drafts faster and leaves the target "
                        "fewer)")
    p.add_argument("--attention-tile", type=int, metavar="B",
                   help="batch tiling on attention: a decode micro-batch's attention runs B "
                        "sequences at a time and the MLP or the experts take the whole "
                        "micro-batch at once (default: the whole micro-batch throughout)")
    p.add_argument("--pattern", dest="patterns", action="append", default=[],
                   metavar="ROLE=NAME[,PREFILL]",
                   help="run a role of kernel (" + ", ".join(DEFAULT_PATTERNS) + ") as another "
                   "registered kernel pattern, in both phases or in decode then prefill "
                   "(repeatable; default: " + "; ".join(
                       f"{role} {','.join(dict.fromkeys(names))}"
                       for role, names in DEFAULT_PATTERNS.items()) + ")")


def add_parser(sub, summary: str) -> None:
    p = sub.add_parser("compile", help=summary)
    p.add_argument("model", help="model preset, model YAML or Hugging Face config.json")
    add_cluster_args(p)
    p.add_argument("-o", "--output", help="run directory to write (program, config, summary)")
    p.add_argument("--viz", action="store_true",
                   help="draw the run directory (figures/, report.html) at the end")
    p.add_argument("--json", action="store_true", help="machine-readable summary on stdout")
    p.set_defaults(func=run, writes_run_dir=True)


def options_from_args(args) -> dict:
    """The compile options the flags give, by their ``CompileOptions`` names."""
    return dict(
        plan=args.plan, prefill_share=args.prefill_share, prefill_systems=args.prefill_systems,
        region=parse_region(args.region) if args.region else None,
        layers_per_stage=args.layers_per_stage, optimize_placement=not args.no_optimize,
        seed=args.seed, routing=args.routing, routing_seed=args.routing_seed,
        attention_tile=args.attention_tile or 0, patterns=tuple(args.patterns),
        draft=args.draft, draft_columns=args.draft_columns)


def compile_from_args(args, model: ModelSpec | None = None) -> WaferProgram:
    """The cluster the flags describe, compiled (``model``: one read already, such as a
    checkpoint's, with the flags' storage formats applied)."""
    model = model or model_from_args(args)
    routing_for(model, args.routing, args.routing_seed)
    return api.compile(model, fabric_from_args(args), args.systems, **options_from_args(args))


def run(args):
    program = compile_from_args(args)
    if args.output:
        write_run_dir(args.output, lambda tmp: write_compiled(tmp, program))
    if args.json:
        return program.summary
    text = render(program)
    if args.output:
        text += f"\n\nwrote {args.output}/ (program.json, program.npz, config.yaml, summary.json)"
    return text


def _formats_line(s: dict) -> list[str]:
    """What the stored formats save: a model that fits only quantized says so."""
    if not s.get("stored_formats"):
        return []
    wafers, dtype = s["wafers_per_replica"], s["wafers_per_replica_in_dtype"]
    fabric = s["cluster"].split(" x ")[-1]
    text = (f"  stored formats       {s['stored_formats']}: {gb(s['weight_bytes_model'])} of "
            f"weights where the dtype's would take {gb(s['weight_bytes_in_dtype'])}")
    if dtype > wafers:
        text += f"; {wafers} x {fabric} per replica hold them where the dtype's would need {dtype}"
    return [text]


def _draft_line(s: dict) -> list[str]:
    """What a draft beside the target takes (``compiler.draft``)."""
    d = s.get("draft")
    if not d:
        return []
    ends = " (its embedding and LM head the target's)" if d.get("shares_target_ends") else ""
    return [f"  draft                {d['model']} on a strip of {d['strip_columns']} columns "
            f"({d['share_of_wafer_pes']:.1%} of the PEs): {gb(d['weight_bytes'])} of weights"
            f"{ends}, "
            f"{gb(d['sram_bytes'])} of SRAM, KV for {d['kv_capacity_tokens']:,} tokens; the "
            f"target keeps KV for {d['target_kv_capacity_tokens']:,}"]


def render(program: WaferProgram, max_stages: int = 6) -> str:
    s = program.summary
    cats = s["sram_bytes_by_category"]
    first = s["regions"][0]
    lines = [
        f"{s['model']} ({count(s['params'])} parameters) on {s['cluster']}, {s['plan']}: "
        f"{len(s['regions'])} region(s), {s['stages_per_region']} stages per region",
        f"  PEs used             {s['pes_used']:,} of {s['pes_total']:,}",
        f"  weights              {gb(s['weight_bytes_total'])} on-wafer = "
        f"{len(s['regions'])} x {gb(s['weight_bytes_model'])}, every element owned by one PE",
        *_formats_line(s),
        f"  SRAM per PE, max     {s['sram_bytes_max_per_pe']:,} of {s['sram_bytes_per_pe']:,} B "
        f"(without KV cache: {s['sram_static_bytes_max_per_pe']:,} B)",
        "  SRAM by category     " + ", ".join(f"{c} {gb(v)}" for c, v in cats.items()),
        f"  colors per PE, max   {s['colors_max_per_pe']} of {s['colors_available']} available",
        f"  KV cache per token   {s['kv_bytes_per_token'] / 1024:g} KiB (all layers)",
        *_draft_line(s),
        "",
        "Regions",
    ]
    rows = []
    for r in s["regions"]:
        pre, dec = r["bounds"]["prefill"], r["bounds"]["decode"]
        rows.append([r["name"], r["role"], f"{r['pes']:,}", r["stages"],
                     f"{r['kv_capacity_tokens']:,}",
                     seconds(pre["pipeline_latency_s"]), f"{si(pre['max_tokens_per_s'])}",
                     seconds(dec["pipeline_latency_s"]), f"{si(dec['max_tokens_per_s'])}"])
    shown = rows if len(rows) <= 8 else rows[:4] + [["..."] + [""] * 8] + rows[-2:]
    lines.append(table(["region", "role", "PEs", "stages", "KV tokens", "prefill time",
                        "prefill tok/s", "decode time", "decode tok/s"], shown, "llrrrrrrr"))
    lines.append(f"  bounds: prefill of {program.options.bound_prefill_tokens} tokens; decode "
                 f"of batch {program.options.bound_decode_batch} at context "
                 f"{program.options.bound_decode_context};\n  time = lower bound on one "
                 "micro-batch through the pipeline; tok/s = upper bound, pipeline full")
    lines += ["", "Placement (per decode token, all stages of a region)"]
    prow = []
    for shape, rep in s["placement"].items():
        for label in ("baseline", "optimized"):
            prow.append([shape, label, si(rep[label]["bytes_hops_per_token"], "B.hop"),
                         si(rep[label]["max_link_bytes_per_token"], "B")])
    lines.append(table(["region shape", "placement", "bytes x hops", "busiest link"], prow,
                       "llrr"))
    lines += ["", f"Stages of {first['name']}"]
    stages = [st for st in s["stages"] if st["region"] == first["name"]]
    srows = []
    for st in stages:
        extra = ("+emb" if st["embedding"] else "") + ("+head" if st["head"] else "")
        srows.append([st["id"], st["rect"], st["holds"] + extra,
                      f"{st['prefill_bound_cycles']:,.0f}", f"{st['decode_bound_cycles']:,.0f}",
                      f"{st['kv_capacity_tokens']:,}"])
    if len(srows) > max_stages:
        srows = srows[:max_stages // 2] + [["..."] + [""] * 5] + srows[-(max_stages // 2):]
    lines.append(table(["stage", "rect", "layers", "prefill bound (cyc)",
                        "decode bound (cyc)", "KV tokens"], srows, "llrrrr"))
    return "\n".join(lines)
