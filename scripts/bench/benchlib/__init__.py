"""What the benchmark scripts share, one part per module.

harness: a benchmark's options, model setup, timing, goals, its finished parts;
record: its JSON record: --out checked before the run, the machine, written whole;
settings: engine settings from --set options, checked before the model loads.
workloads: the requests a benchmark sends (prompts, lengths, when each arrives);
prompt_texts: the texts they are built from.
runners: the engines that serve them, ours and mlx-lm's, each timed the same way;
traces: requests arriving over time through a fresh Engine, and their latency.
chats: requests answered one after another and chats replayed, each reply measured.
decoding: a model driven token by token, ours and mlx-lm's.
servers: ours and mlx_lm.server in subprocesses, for the HTTP benchmarks.
measure: the numbers a run yields (TTFT, inter-token gaps, stalls) and their goals;
roofline: the decode step's bound from the weights' bytes and the read bandwidth,
and MBU: the share of that bandwidth a measured decode uses.
llama_cpp_peer: llama.cpp on the embedded model's GGUF, where it is installed.
fast_path_before: the fast path before cpu_attention and fast_exp, for side by side.
render: tables and the Markdown report; plots: the pictures.
schemas: the JSON schemas of the structured-output benchmark and tests.

A script imports tiny_llm_base before this package: the fast BLAS must load before
mlx.core.
"""
