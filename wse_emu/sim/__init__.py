"""Running programs: a step of a region stage by stage (runner), the functional engine that computes
a small model's numbers through the compiled tiles, synthetic network traffic and timelines."""
