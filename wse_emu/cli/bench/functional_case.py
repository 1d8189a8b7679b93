"""A functional case: greedy generation computed through the tiles, prefill of one tile and
then decode steps, the fastest of ``repeat`` runs, as tokens/s."""

from __future__ import annotations

import time

from wse_emu.cli.bench.case import peak_rss_mib, report


def measure(case: dict) -> dict:
    from wse_emu import api
    from wse_emu.models.weights import random_weights
    from wse_emu.sim.functional.generate import Generator

    model = api.load_model("tiny").replaced(**case["model"])
    program = api.compile(model, case["fabric"], region=tuple(case["region"]))
    generator = Generator(program, random_weights(model, 0), case["dtype"])
    prompt = [(7 * i) % model.vocab_size for i in range(case["prompt"])]
    generator.generate(prompt[:4], 2)  # warm
    prefill, decode = [], []
    for _ in range(case["repeat"]):
        start = time.perf_counter()
        generator.run_prompt(prompt)
        prefill.append(time.perf_counter() - start)
        start = time.perf_counter()
        token = 1
        for _ in range(case["decode"]):
            token = int(generator.step(token).argmax())
        decode.append(time.perf_counter() - start)
    return {"prefill_tokens_per_s": case["prompt"] / min(prefill),
            "decode_tokens_per_s": case["decode"] / min(decode),
            "pes": program.region(program.regions[0].name).pes,
            "peak_rss_mib": peak_rss_mib()}


if __name__ == "__main__":
    report(measure)
