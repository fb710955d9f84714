"""Prefill and decode speed of the week-2 model against mlx-lm's, side by side.

    pdm run bench [--repeats 5] [--decode-tokens 64] [--out results.json]

Contenders, all running the embedded SmolLM2-135M on MLX's default device:
- tiny fast:   Qwen2ModelWeek2(weights="float32", use_fast_kernels=True)
- tiny:        the same with the hand-written kernels (use_fast_kernels=False)
- mlx-lm f32:  mlx-lm's own model holding the SAME float32 weights (float32_copy:
               each quantized layer dequantized with float32 scales, where
               mlx_lm.utils.dequantize_model would round them in the scales' float16)
- mlx-lm q4:   mlx-lm's model as it loads: 4-bit linears, 8-bit embedding

Measures, in tokens per second:
- prefill N: N over the time of one forward of an N-token prompt into an empty
  cache (computing all N logits, as both models do).
- decode: greedy decoding of --decode-tokens tokens after a 16-token prompt, one
  token per forward, each evaluated before the next.

Repetitions are interleaved: each round runs every contender once, so a busy
neighbour slows all of them alike, and the table shows each one's median. A
contender whose runs of one measure have taken more than --budget-s stops repeating
it (mlx-lm q4 prefills slowly on a CPU, where quantized matmul has no BLAS).

Decode roofline: a decode step reads every weight once (every linear layer, the
lm head, one row of the embedding), so it cannot take less than weight bytes /
memory bandwidth. The bandwidth is measured here, one thread reading a 256 MB array
with numpy (see read_bandwidth).
"""

import argparse
import json
import os
import platform
import statistics
import time

import tiny_llm_base  # noqa: F401  (first: loads the fast BLAS before mlx.core)

# isort: split
import mlx.core as mx
import numpy as np
from mlx import nn
from mlx.utils import tree_flatten
from mlx_lm.models.cache import make_prompt_cache
from rich.console import Console
from rich.table import Table

from scripts.bench.benchlib.course import add_option, course, run_benchmark, use
from scripts.commands.cli import (
    context_length,
    fail,
    option_parser,
    require_at_least,
    require_positive,
)
from tiny_llm_base.fast_blas import STATUS
from tiny_llm_base.mlx_lm_reference import float32_copy

DECODE_PROMPT_TOKENS = 16
BANDWIDTH_BYTES = 256 * 1024 * 1024


class TinyRunner:
    """Drives a Qwen2ModelWeek2: it needs the offset of every call."""

    def __init__(self, model):  # the package's Qwen2ModelWeek2
        self.model = model

    def prefill(self, prompt: mx.array) -> mx.array:
        self.cache = self.model.create_kv_cache()
        self.offset = prompt.shape[1]
        return self.model(prompt, 0, self.cache)

    def step(self, token: mx.array) -> mx.array:
        logits = self.model(token[:, None], self.offset, self.cache)
        self.offset += 1
        return logits


class MlxLmRunner:
    """Drives an mlx-lm model: its own KV cache counts the offset."""

    def __init__(self, model: nn.Module):
        self.model = model

    def prefill(self, prompt: mx.array) -> mx.array:
        self.cache = make_prompt_cache(self.model)
        return self.model(prompt, cache=self.cache)

    def step(self, token: mx.array) -> mx.array:
        return self.model(token[:, None], cache=self.cache)


def weight_bytes_per_token(float_model: nn.Module) -> int:
    """Bytes of weights one decode step reads: all of them, except that the
    embedding lookup reads one row of its table; a tied head reads the table."""
    total = sum(p.nbytes for _, p in tree_flatten(float_model.parameters()))
    table = float_model.model.embed_tokens.weight
    total -= table.nbytes - table.nbytes // table.shape[0]
    if float_model.args.tie_word_embeddings:
        total += table.nbytes
    return total


def read_bandwidth(passes: int = 7) -> float:
    """Bytes per second one thread reads from memory: the best of several passes over
    a 256 MB array, with a float32 max and with an int32 bitwise-or (about the least
    arithmetic per byte numpy can do), whichever is faster."""
    data = np.random.default_rng(0).random(BANDWIDTH_BYTES // 4, dtype=np.float32)
    reads = (data.max, lambda: np.bitwise_or.reduce(data.view(np.int32)))
    best = float("inf")
    for read in reads:
        read()
        for _ in range(passes):
            start = time.perf_counter()
            read()
            best = min(best, time.perf_counter() - start)
    return data.nbytes / best


def time_prefill(runner, prompt: mx.array) -> float:
    start = time.perf_counter()
    mx.eval(runner.prefill(prompt))
    return prompt.shape[1] / (time.perf_counter() - start)


def time_decode(runner, prompt: mx.array, tokens: int) -> float:
    token = mx.argmax(runner.prefill(prompt)[:, -1], axis=-1)
    mx.eval(token)
    start = time.perf_counter()
    for _ in range(tokens):
        token = mx.argmax(runner.step(token)[:, -1], axis=-1)
        mx.eval(token)
    return tokens / (time.perf_counter() - start)


def measure(console, runners, jobs, repeats: int, budget_s: float) -> dict:
    """jobs: measure name -> fn(runner) -> tokens/s. Returns name -> contender -> runs."""
    runs = {name: {contender: [] for contender in runners} for name in jobs}
    spent = {name: dict.fromkeys(runners, 0.0) for name in jobs}
    for round_number in range(repeats):
        for name, job in jobs.items():
            for contender, runner in runners.items():
                if round_number > 0 and spent[name][contender] > budget_s:
                    continue
                status = f"round {round_number + 1}/{repeats}: {name}, {contender}"
                with console.status(status):
                    start = time.perf_counter()
                    runs[name][contender].append(job(runner))
                    spent[name][contender] += time.perf_counter() - start
    return runs


def parse_args() -> argparse.Namespace:
    parser = option_parser(__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--prompt-lengths", type=int, nargs="+", default=[128, 1024])
    parser.add_argument("--decode-tokens", type=int, default=64)
    parser.add_argument(
        "--budget-s",
        type=float,
        default=30.0,
        help="stop repeating a contender's measure after this many seconds",
    )
    parser.add_argument("--out", help="also write the measurements as JSON here")
    add_option(parser)
    args = parser.parse_args()
    use(args)
    require_at_least(args, 1, "--repeats", "--prompt-lengths", "--decode-tokens")
    require_positive(args, "--budget-s")
    return args


def check_context(args: argparse.Namespace, context: int) -> None:
    """Each prompt, and the decode's prompt with its tokens, fit the model's context."""
    longest = max(args.prompt_lengths)
    if longest > context:
        fail(
            f"--prompt-lengths {longest} is beyond the model's context of {context} "
            f"positions (max_position_embeddings): give at most {context}"
        )
    decode = DECODE_PROMPT_TOKENS + args.decode_tokens
    if decode > context:
        fail(
            f"--decode-tokens {args.decode_tokens} after a {DECODE_PROMPT_TOKENS}-token "
            f"prompt needs {decode} positions, beyond the model's context of "
            f"{context}: give at most {context - DECODE_PROMPT_TOKENS}"
        )


def main() -> None:
    args = parse_args()
    console = Console()
    blas = (
        f"OpenBLAS ({STATUS.library})"
        if STATUS.active
        else (STATUS.hint or "platform BLAS")
    )
    load_before = os.getloadavg()
    console.print(
        f"mlx {mx.__version__} on {mx.default_device()}, {platform.machine()}, "
        f"{os.cpu_count()} CPUs; {blas}; load average {load_before[0]:.1f}"
    )

    with console.status("loading the embedded model"):
        quantized, _ = course.load_model()
    check_context(args, context_length(quantized))
    with console.status("loading it again for a float32 copy"):
        float32 = float32_copy(course.load_model()[0])
    runners = {
        "tiny fast": TinyRunner(
            course.Qwen2ModelWeek2(quantized, weights="float32", use_fast_kernels=True)
        ),
        "tiny": TinyRunner(course.Qwen2ModelWeek2(quantized, weights="float32")),
        "mlx-lm f32": MlxLmRunner(float32),
        "mlx-lm q4": MlxLmRunner(quantized),
    }
    vocab = quantized.args.vocab_size
    mx.random.seed(0)
    prompts = {n: mx.random.randint(0, vocab, (1, n)) for n in args.prompt_lengths}
    decode_prompt = mx.random.randint(0, vocab, (1, DECODE_PROMPT_TOKENS))
    with console.status("warming up (dequantizing, compiling)"):
        for runner in runners.values():
            time_decode(runner, decode_prompt, 2)

    jobs = {
        f"prefill {n}": (lambda runner, p=prompt: time_prefill(runner, p))
        for n, prompt in prompts.items()
    }
    jobs[f"decode {args.decode_tokens}"] = lambda runner: time_decode(
        runner, decode_prompt, args.decode_tokens
    )
    runs = measure(console, runners, jobs, args.repeats, args.budget_s)

    with console.status("measuring memory bandwidth"):
        bandwidth = read_bandwidth()
    bytes_per_token = weight_bytes_per_token(float32)
    roofline = bandwidth / bytes_per_token
    load_after = os.getloadavg()

    medians = {
        name: {c: statistics.median(r) for c, r in by_contender.items()}
        for name, by_contender in runs.items()
    }
    table = Table(title="tokens/s: median of interleaved runs (number of runs)")
    table.add_column("measure")
    for contender in runners:
        table.add_column(contender, justify="right")
    table.add_column("fast / f32", justify="right")
    table.add_column("fast / q4", justify="right")
    for name, by_contender in medians.items():
        cells = [f"{by_contender[c]:.1f} ({len(runs[name][c])})" for c in runners]
        ours = by_contender["tiny fast"]
        table.add_row(
            name,
            *cells,
            f"{ours / by_contender['mlx-lm f32']:.2f}x",
            f"{ours / by_contender['mlx-lm q4']:.2f}x",
        )
    console.print(table)
    decode = medians[f"decode {args.decode_tokens}"]
    console.print(
        f"decode roofline: {bandwidth / 1e9:.1f} GB/s read bandwidth / "
        f"{bytes_per_token / 1e6:.0f} MB of float32 weights per token = "
        f"{roofline:.1f} tokens/s; "
        + ", ".join(f"{c} reaches {decode[c] / roofline:.0%}" for c in runners)
    )
    console.print(
        f"load average {load_before[0]:.1f} before, {load_after[0]:.1f} after: "
        "a busy machine makes every figure noisy"
    )

    if args.out:
        meta = {
            "mlx": mx.__version__,
            "device": str(mx.default_device()),
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
            "blas": blas,
            "load_average": {"before": load_before, "after": load_after},
        }
        roofline_info = {
            "read_bandwidth_bytes_per_s": bandwidth,
            "weight_bytes_per_token": bytes_per_token,
            "decode_tokens_per_s": roofline,
        }
        with open(args.out, "w") as f:
            json.dump(
                {
                    "meta": meta,
                    "roofline": roofline_info,
                    "tokens_per_s": runs,
                    "median_tokens_per_s": medians,
                },
                f,
                indent=2,
            )


if __name__ == "__main__":
    run_benchmark(main)
