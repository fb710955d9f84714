"""Do greedy answers depend on what else runs? `pdm run greedy-determinism`.

pdm run greedy-determinism                       # float32 and int4 KV, 12 prompts
pdm run greedy-determinism --kv-dtypes int4 --prompts 6 --tokens 16
pdm run greedy-determinism --speculative none    # one token a step

The engine `pdm run serve` builds (mixed policy, paged cache, batch size 8, its
default step limits, prompt-lookup speculation), on the embedded model, answers a
fixed set of chat prompts greedily (EOS ends an answer, as it does served). Every
answer is compared token for token with the same prompt's answer run alone on an
engine without prefix caching (the baseline), in these runs:

  alone again    each prompt alone once more on that engine: is a run repeatable?
  beside others  every prompt added at once, --batch-size at a time, no caching
  cache, 1st     prefix caching on, each prompt alone: from the second prompt on,
                 the chat template's shared start is found cached
  cache hit      the same prompts again on that engine: each one's own full
                 blocks are found cached (what a client resending a prompt meets)

Each KV dtype gets engines of its own. Printed: per run and dtype, how many answers
differ from the baseline and each one's first changed token (counted from 1); the date and `uptime` first,
since the machine's load is part of what was measured. No server is started.
"""

import tiny_llm_base  # noqa: F401  (first: the fast BLAS before mlx.core)

# isort: split
import argparse
import datetime
import os
import subprocess
import sys
import time

from scripts.bench.benchlib.course import add_option, course, run_benchmark, use
from scripts.bench.benchlib.prompt_texts import OPEN_QUESTIONS, SHORT_QUESTIONS
from scripts.bench.benchlib.runners import run_to_end
from scripts.bench.benchlib.workloads import chat
from scripts.commands.cli import option_parser, require_at_least
from scripts.commands.engine_options import (
    NO_LIMIT,
    add_scheduling_options,
    check_scheduling_options,
    scheduling_settings,
)
from scripts.commands.model_loading import build_model, load_model_or_exit
from tiny_llm_base import PromptSpec

# 16 distinct questions, --prompts takes the first: the short ones, then the
# open-ended ones not among them.
QUESTIONS = SHORT_QUESTIONS + [q for q in OPEN_QUESTIONS if q not in SHORT_QUESTIONS]
KV_DTYPES = ("float32", "float16", "int8", "int4")
MAX_TOKENS = 256  # --tokens at most: the run stays a few minutes
RUNS = ("alone again", "beside others", "cache, 1st", "cache hit")


def parse_args() -> argparse.Namespace:
    parser = option_parser("Count the greedy answers that change with what runs.")
    add_option(parser)
    add_scheduling_options(parser)
    parser.add_argument(
        "--prompts",
        type=int,
        default=12,
        help=f"chat prompts, 1 to {len(QUESTIONS)} (12)",
    )
    parser.add_argument("--tokens", type=int, default=24, help="answer tokens (24)")
    parser.add_argument("--batch-size", type=int, default=8, help="decode slots (8)")
    parser.add_argument(
        "--kv-dtypes",
        nargs="+",
        choices=KV_DTYPES,
        default=["float32", "int4"],
        help="the paged pool's dtypes to measure (float32 int4)",
    )
    args = parser.parse_args()
    require_at_least(args, 1, "--prompts", "--tokens", "--batch-size")
    if args.prompts > len(QUESTIONS):
        parser.error(f"--prompts must be at most {len(QUESTIONS)}, got {args.prompts}")
    if args.tokens > MAX_TOKENS:
        parser.error(f"--tokens must be at most {MAX_TOKENS}, got {args.tokens}")
    check_scheduling_options(args)
    use(args)
    return args


def engine_settings(args: argparse.Namespace) -> dict:
    """What `pdm run serve` gives its Engine by default, this script's options in
    (at --batch-size 1 no slot is kept for interactive requests: serve needs
    --reserved-interactive-slots 0 there)."""
    return dict(
        batch_size=args.batch_size,
        max_seq_len=512,
        prefill_step=128,
        reserved_interactive_slots=min(1, args.batch_size - 1),
        kv_cache="paged",
        **scheduling_settings(args, args.policy or "mixed", course.package),
    )


def answers(engine, prompts: list[list[int]], tokens: int, together: bool) -> list:
    """Each prompt's greedy tokens: all added at once, or each run alone."""
    specs = [PromptSpec(p, max_tokens=tokens) for p in prompts]
    if together:
        return [r.tokens for r in run_to_end(engine, specs)]
    return [run_to_end(engine, [spec])[0].tokens for spec in specs]


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first position where two answers differ (None: identical)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def measure(model, tokenizer, prompts, args, kv_dtype: str) -> dict[str, list]:
    """Per run (RUNS), the first difference from the baseline of each prompt."""
    settings = dict(engine_settings(args), kv_dtype=kv_dtype)
    uncached = course.Engine(model, tokenizer, **settings, prefix_caching=False)
    cached = course.Engine(model, tokenizer, **settings, prefix_caching=True)
    baseline = answers(uncached, prompts, args.tokens, together=False)
    runs = {
        "alone again": answers(uncached, prompts, args.tokens, together=False),
        "beside others": answers(uncached, prompts, args.tokens, together=True),
        "cache, 1st": answers(cached, prompts, args.tokens, together=False),
        "cache hit": answers(cached, prompts, args.tokens, together=False),
    }
    hit = cached.metrics.prefix_cached_tokens
    print(f"  {kv_dtype}: {hit} prompt tokens found cached", file=sys.stderr)
    return {
        run: [first_difference(a, b) for a, b in zip(baseline, got)]
        for run, got in runs.items()
    }


def first_tokens(positions: list[int]) -> str:
    """0-based positions as the answers' token numbers counted from 1: "2, 9"."""
    return ", ".join(str(p + 1) for p in sorted(positions))


def render(results: dict[str, dict[str, list]]) -> str:
    """A table: per run and dtype, answers that differ and their first positions."""
    dtypes = list(results)
    lines = ["| run | " + " | ".join(f"{d} KV" for d in dtypes) + " |"]
    lines.append("|---" * (len(dtypes) + 1) + "|")
    for run in RUNS:
        cells = []
        for dtype in dtypes:
            where = [p for p in results[dtype][run] if p is not None]
            total = len(results[dtype][run])
            cells.append(
                f"{len(where)} of {total}"
                + (f" (first changed token: {first_tokens(where)})" if where else "")
            )
        lines.append(f"| {run} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    args = parse_args()
    started = datetime.datetime.now().astimezone()
    load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(f"{started:%Y-%m-%d %H:%M %Z}, {os.cpu_count()} CPUs; uptime: {load}")
    mlx_model, tokenizer = load_model_or_exit(None)
    model = build_model(course.package, mlx_model, "week2-fast")
    prompts = [
        chat(tokenizer, [{"role": "user", "content": q}])
        for q in QUESTIONS[: args.prompts]
    ]
    speculative = "none" if args.speculative == NO_LIMIT else "ngram (default)"
    print(
        f"{course.package.__name__}, {len(prompts)} chat prompts, {args.tokens} "
        f"tokens each, batch size {args.batch_size}, speculation {speculative}"
    )
    clock = time.perf_counter()
    results = {
        dtype: measure(model, tokenizer, prompts, args, dtype)
        for dtype in args.kv_dtypes
    }
    print(render(results))
    load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(f"{time.perf_counter() - clock:.0f} s; uptime after: {load}")


if __name__ == "__main__":
    run_benchmark(main)
