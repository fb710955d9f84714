"""What the benchmark scripts share, one part per module.

harness: a benchmark's options, machine metadata, model setup, timing, goals, JSON.
workloads: the requests a benchmark sends (prompts, lengths, when each arrives);
prompt_texts: the texts they are built from.
runners: the engines that serve them, ours and mlx-lm's, each timed the same way.
servers: ours and mlx_lm.server in subprocesses, for the HTTP benchmarks.
measure: the numbers a run yields (TTFT, inter-token gaps, stalls) and their goals.
render: tables and the Markdown report; plots: the pictures.
schemas: the JSON schemas of the structured-output benchmark and tests.

A script imports tiny_llm_base before this package: the fast BLAS must load before
mlx.core.
"""
