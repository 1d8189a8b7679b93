"""``wse-emu inspect``: the op graph with FLOPs, bytes and arithmetic intensity per op."""

from __future__ import annotations

import os

from wse_emu.cli.compile_cmd import add_format_args, add_routing_args, model_from_args
from wse_emu.cli.fabric_args import add_fabric_args, fabric_from_args
from wse_emu.compiler.intensity import analyze
from wse_emu.compiler.opgraph import build_op_graph
from wse_emu.compiler.partition import wafers_needed
from wse_emu.errors import UserError
from wse_emu.models.layer import MicroBatch
from wse_emu.models.routing import load_summary, routing_for
from wse_emu.models.spec import check_positions, formats_text, native
from wse_emu.rundir.directory import write_run_dir
from wse_emu.rundir.write import write_json
from wse_emu.util.fmt import si, table


def add_parser(sub, summary: str) -> None:
    p = sub.add_parser("inspect", help=summary)
    p.add_argument("model", help="model preset, model YAML or Hugging Face config.json")
    add_fabric_args(p)
    add_format_args(p)
    p.add_argument("--phase", choices=["prefill", "decode"], default="decode")
    p.add_argument("--tokens", type=int, default=4096, help="prefill: prompt tokens S")
    p.add_argument("--batch", type=int, default=1, help="decode: sequences B")
    p.add_argument("--context", type=int, default=4096, help="decode: cached tokens L")
    p.add_argument("--all-layers", action="store_true", help="list the ops of every layer")
    add_routing_args(p)
    p.add_argument("-o", "--output",
                   help="run directory: inspect.json (the op table, the model and the fabric)")
    p.add_argument("--viz", action="store_true",
                   help="draw the run directory (the roofline, report.html) at the end")
    p.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    p.set_defaults(func=run, writes_run_dir=True)


def run(args) -> dict | str:
    model = model_from_args(args)
    fabric = fabric_from_args(args)
    for name in ("tokens", "batch", "context"):
        if getattr(args, name) < 1:
            raise UserError(f"--{name} must be at least 1, got {getattr(args, name)}")
    if args.phase == "decode":
        check_positions(model, args.context, f"a decode step at --context {args.context}")
    else:
        check_positions(model, args.tokens, f"a prompt of --tokens {args.tokens}")
    work = MicroBatch(args.phase, tokens=args.tokens, batch=args.batch, context=args.context)
    routing = routing_for(model, args.routing, args.routing_seed)
    loads = (load_summary(routing, model.experts.count, model.experts.top_k, work.new_tokens)
             if model.is_moe else None)
    result = analyze(build_op_graph(model), model, work, fabric,
                     loads["active_experts"] if loads else None)
    layers = result["layers"]
    data = {
        "model": model.name, "fabric": fabric.name, "workload": result["workload"],
        "ridge_flop_per_byte": result["ridge_flop_per_byte"],
        "ops": [row.to_dict() for row in result["ops"]],
        "layers": [{"layer": i, "flops": c.flops, "bytes": c.bytes, "intensity": c.intensity}
                   for i, c in sorted(layers.items())],
        "total": {"flops": result["total"].flops, "bytes": result["total"].bytes,
                  "intensity": result["total"].intensity},
        "params": {"total": model.params(), "active": model.active_params(),
                   "stored_bytes": model.weight_bytes(),
                   "bytes_in_dtype": native(model).weight_bytes()},
        "systems": {"as_stored": wafers_needed(model, fabric),
                    "in_dtype": wafers_needed(native(model), fabric)},
        **({"expert_loads": loads} if loads else {}),
    }
    if args.output:
        # Everything to redraw it: the model and the fabric as resolved, beside the table.
        record = {**data, "model_spec": model.to_dict(), "fabric_spec": fabric.to_dict()}
        write_run_dir(args.output, lambda tmp: write_json(tmp, "inspect.json", record))
    if args.json:
        return data
    # Layers whose costs match share one listing (Gemma's sliding and full layers differ).
    kinds: dict[tuple, list[int]] = {}
    for i, c in sorted(layers.items()):
        kinds.setdefault((c.flops, c.bytes), []).append(i)
    firsts = {members[0] for members in kinds.values()}
    shown = [r for r in result["ops"] if args.all_layers or r.layer is None or r.layer in firsts]
    rows = [[r.node, r.kind, si(r.cost.flops), si(r.cost.weight_bytes, "B"),
             si(r.cost.act_bytes, "B"), si(r.cost.kv_bytes, "B"), f"{r.cost.intensity:.3g}",
             r.bound] for r in shown]
    total = result["total"]
    lines = [
        f"{model.name}: {work.describe()}; {fabric.name} PE ridge point "
        f"{result['ridge_flop_per_byte']:.3g} FLOP per SRAM byte read",
        "",
        table(["op", "kind", "FLOPs", "weights", "activations", "KV", "FLOP/B", "bound"], rows,
              "llrrrrrl"),
        "",
        *(f"per layer ({_layers_text(members, len(layers))}): {si(layers[members[0]].flops)}"
          f"FLOP, {si(layers[members[0]].bytes, 'B')} moved, "
          f"{layers[members[0]].intensity:.3g} FLOP/B" for members in kinds.values()),
        f"whole model: {si(total.flops)}FLOP, {si(total.bytes, 'B')} moved, "
        f"{total.intensity:.3g} FLOP/B",
        _params_text(model),
        _systems_text(model, fabric),
        *([_loads_text(loads)] if loads else []),
    ]
    if not args.all_layers and len(layers) > 1:
        if len(kinds) == 1:
            lines.append(f"(layers 1-{len(layers) - 1} repeat layer 0; --all-layers lists them)")
        else:
            lines.append(f"(layers {', '.join(str(m[0]) for m in kinds.values())} are listed; "
                         "--all-layers lists every layer)")
    if args.output:
        lines.append(f"wrote {args.output}{os.sep} (inspect.json)")
    return "\n".join(lines)


def _params_text(model) -> str:
    """'parameters: 8.03 G, 16.1 GB as stored', or for a mixture of experts the total and one
    token's share."""
    formats = formats_text(model)
    stored = f"{si(model.weight_bytes(), 'B')} as stored" + (f" ({formats})" if formats else "")
    if not model.is_moe:
        return f"parameters: {si(model.params())}, {stored}"
    return (f"parameters: {si(model.params())} in all, {si(model.active_params())} used per "
            f"token ({model.experts.top_k} of {model.experts.count} experts per layer; "
            f"{si(model.active_params() - model.embedding_params())} without the embedding "
            f"table), {stored}")


def _systems_text(model, fabric) -> str:
    """'systems: 2 x wse3 hold the weights by SRAM (7 in the model's dtype)'."""
    stored, dtype = wafers_needed(model, fabric), wafers_needed(native(model), fabric)
    text = f"systems: {stored} x {fabric.name} hold the weights by SRAM"
    return text + (f" ({dtype} in the model's dtype)" if dtype != stored else "")


def _loads_text(loads: dict) -> str:
    return (f"experts in a drawn step ({loads['routing']}): {loads['active_experts']} of "
            f"{loads['experts']} receive tokens; the busiest takes {loads['busiest_tokens']} of "
            f"the {loads['tokens']} tokens, {loads['mean_tokens_per_active_expert']:.3g} on "
            "average (the expert weights above are those of the experts it reaches, the same "
            "draw in every layer)")


def _layers_text(members: list[int], total: int) -> str:
    """'all 32 alike', '21 like layer 0, every 2' or '5 like layer 3'."""
    if len(members) == total:
        return f"all {total} alike"
    gaps = {b - a for a, b in zip(members, members[1:])}
    every = f", every {gaps.pop()}" if len(gaps) == 1 else ""
    return f"{len(members)} like layer {members[0]}{every}"
