"""Run directories: the one writer and reader of what a run leaves on disk (program, counters,
requests, metrics, timelines, experiments) and the checks of what is read back."""
