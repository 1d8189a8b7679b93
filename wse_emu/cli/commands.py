"""The commands, what each does in a line, and the module that adds its arguments and runs it.

The listing is all that ``wse-emu --help`` needs, so a command's module (and whatever heavy
library it imports) is imported only when that command runs.
"""

COMMANDS = {
    "demo": ("wse_emu.cli.demo",
            "Llama-3.1-8B on a WSE-3 both ways: compile, time a decode step, compare serving,"
            " draw a report"),
    "inspect": ("wse_emu.cli.inspect_cmd",
               "op graph, FLOPs, bytes moved and arithmetic intensity"),
    "compile": ("wse_emu.cli.compile_cmd",
               "compile a model onto a cluster of wafers"),
    "run": ("wse_emu.cli.run_cmd",
           "simulate one prefill or decode step of a compiled program"),
    "serve": ("wse_emu.cli.serve_cmd",
             "serve a request workload on a cluster"),
    "experiment": ("wse_emu.cli.experiment_cmd",
                  "experiments that answer a question end to end"),
    "generate": ("wse_emu.cli.generate_cmd",
                "greedy generation computed through the compiled tiles"),
    "sweep": ("wse_emu.cli.sweep_cmd",
              "every combination of a sweep's axes in parallel, resumable"),
    "noc": ("wse_emu.cli.noc_cmd",
           "latency and accepted throughput under synthetic traffic"),
    "validate": ("wse_emu.cli.validate_cmd",
                 "every published measurement we compare against, beside our figure"),
    "viz": ("wse_emu.cli.viz_cmd",
           "draw a run directory: figures/ and report.html"),
    "bench": ("wse_emu.cli.bench",
             "speed and memory benchmarks (JSON)"),
    "list": ("wse_emu.cli.list_cmd",
            "list the model, fabric, accelerator, workload and trace presets"),
}
