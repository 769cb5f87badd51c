"""The tools behind the subcommands, usable from Python too: benchmarks, precision checks,
model and environment reports, traces, plots, synthetic inputs, tables and progress lines."""
