"""What the benchmark scripts share, one part per module.

workloads: the requests a benchmark sends (prompts, lengths, when each arrives).
runners: the engines that serve them, ours and mlx-lm's, each timed the same way.
measure: the numbers a run yields (TTFT, inter-token gaps, stalls) and the goals.
render: tables, the JSON record, plots and the timeline picture.

A script imports tiny_llm_base before this package: the fast BLAS must load before
mlx.core.
"""
