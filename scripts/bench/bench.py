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
memory bandwidth. The bandwidth is measured here with numpy reading a 256 MB array,
on one thread and on every core, the larger counting (benchlib/roofline.py). Each
float32 contender's decode MBU (model bandwidth utilization): the weights and the
float32 cache at the mean context read a step, times its steps per second, over it.

Goal: tiny fast at least 0.9x mlx-lm f32's tokens/s on every measure (the same
weights); a missed one makes the exit status 1.
"""

from scripts.commands.interrupt import exit_on_interrupt

exit_on_interrupt()  # first: Ctrl-C during the imports below never shows a traceback

import tiny_llm_base  # noqa: F401  (first: loads the fast BLAS before mlx.core)

# isort: split
import argparse

import mlx.core as mx

from scripts.bench.benchlib.course import course, run_benchmark
from scripts.bench.benchlib.decoding import (
    Decoder,
    MlxLmDecoder,
    decode_times,
    prefill_seconds,
)
from scripts.bench.benchlib.harness import Bench, interleaved, medians
from scripts.bench.benchlib.goals import at_least
from scripts.bench.benchlib.roofline import (
    bytes_per_step,
    mbu,
    measure_bandwidth,
    weight_bytes_per_token,
)
from scripts.commands.cli import fail
from scripts.commands.model_loading import context_length

DECODE_PROMPT_TOKENS = 16
# The goal: on the same float32 weights the fast path keeps up with mlx-lm on every
# measure (within the 10% two runs on a shared machine differ by).
GOAL_RATIO = 0.9


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


def main() -> int:
    bench = Bench(__doc__, repeats=(5, "interleaved rounds of every measure"))
    bench.option("--prompt-lengths", [128, 1024], least=1)
    bench.option("--decode-tokens", 64, least=1)
    help = "stop repeating a contender's measure after this many seconds"
    bench.option("--budget-s", 30.0, help, positive=True)
    args = bench.parse()
    console = bench.start()
    models = bench.models()
    quantized = models.mlx_model
    check_context(args, context_length(quantized))
    with console.status("a float32 copy"):
        float32 = models.peer
    runners = {
        "tiny fast": Decoder(models.float32),
        "tiny": Decoder(course.Qwen2ModelWeek2(quantized, weights="float32")),
        "mlx-lm f32": MlxLmDecoder(float32),
        "mlx-lm q4": MlxLmDecoder(quantized),
    }
    vocab = quantized.args.vocab_size
    mx.random.seed(0)
    prompts = {n: mx.random.randint(0, vocab, (1, n)) for n in args.prompt_lengths}
    decode_prompt = mx.random.randint(0, vocab, (1, DECODE_PROMPT_TOKENS))
    with console.status("warming up (dequantizing, compiling)"):
        for runner in runners.values():
            decode_times(runner, decode_prompt, 2)

    jobs = {  # tokens/s
        f"prefill {n}": lambda r, p=prompt, n=n: n / prefill_seconds(r, p)
        for n, prompt in prompts.items()
    }
    n = args.decode_tokens
    jobs[f"decode {n}"] = lambda r: n / sum(decode_times(r, decode_prompt, n))
    flat = {
        (name, contender): lambda job=job, runner=runner: job(runner)
        for name, job in jobs.items()
        for contender, runner in runners.items()
    }
    done = interleaved(flat, args.repeats, args.budget_s, console)
    runs = {name: {c: done[name, c] for c in runners} for name in jobs}

    with console.status("measuring memory bandwidth"):
        measured = measure_bandwidth()
    bandwidth = measured.best
    bytes_per_token = weight_bytes_per_token(float32)
    roofline = bandwidth / bytes_per_token
    context = DECODE_PROMPT_TOKENS + args.decode_tokens / 2
    step_bytes = bytes_per_step(float32, context)

    median = {name: medians(by_contender) for name, by_contender in runs.items()}
    columns = {"measure": lambda name, _: name}
    for c in runners:
        columns[c] = lambda name, by, c=c: f"{by[c]:.1f} ({len(runs[name][c])})"
    for c, peer in (("fast / f32", "mlx-lm f32"), ("fast / q4", "mlx-lm q4")):
        columns[c] = lambda _, by, p=peer: f"{by['tiny fast'] / by[p]:.2f}x"
    title = "tokens/s: median of interleaved runs (number of runs)"
    bench.table(title, columns, median)
    decode = median[f"decode {args.decode_tokens}"]
    console.print(measured.line())
    console.print(
        f"decode roofline: {bandwidth / 1e9:.1f} GB/s read bandwidth / "
        f"{bytes_per_token / 1e6:.0f} MB of float32 weights per token = "
        f"{roofline:.1f} tokens/s; "
        + ", ".join(f"{c} reaches {decode[c] / roofline:.0%}" for c in runners)
    )
    used = {
        c: mbu(step_bytes, decode[c], bandwidth) for c in runners if c != "mlx-lm q4"
    }
    console.print(
        f"decode MBU ({step_bytes / 1e6:.0f} MB a step at {context:g} positions): "
        + ", ".join(f"{c} {u:.2f}" for c, u in used.items())
    )
    roofline_info = {
        "read_bandwidth_bytes_per_s": bandwidth,
        "bandwidth": measured.record(),
        "weight_bytes_per_token": bytes_per_token,
        "decode_tokens_per_s": roofline,
        "bytes_per_step": step_bytes,
        "mbu": used,
    }
    record = dict(roofline=roofline_info, tokens_per_s=runs, median_tokens_per_s=median)
    goals = [
        at_least(
            f"{name}: tokens/s, tiny fast / mlx-lm f32 (the same weights)",
            by["tiny fast"] / by["mlx-lm f32"],
            GOAL_RATIO,
            f"tiny fast {by['tiny fast']:.1f}, mlx-lm f32 {by['mlx-lm f32']:.1f}",
        )
        for name, by in median.items()
    ]
    return bench.finish(record, goals)


if __name__ == "__main__":
    run_benchmark(main)
