"""Serve many prompts at once: continuous batching with chunked prefill, watched live.

pdm run batch-main
pdm run batch-main --batch-size 3 --prefill-step none --max-tokens 32
pdm run batch-main --token-budget 256 --max-num-partial-prefills 2
pdm run batch-main --policy alternate          # week 2's two forwards a step
pdm run batch-main --kv-cache paged --kv-memory 64MiB
pdm run batch-main --prompts-file prompts.txt --solution learner
pdm run batch-main --json-schema person.json   # structured outputs (week 3 day 5)
pdm run batch-main --choice yes --choice no    # also --regex, --json-object
pdm run mlx.launch -n 2 --backend ring -- python batch-main.py  # tensor parallel

A terminal gets a live table of the decode slots; otherwise (a pipe, a log file) only
the periodic engine lines are printed. Both end with every prompt's answer, shortened,
and the whole error of each request that failed; the exit status is then 1.

Under mlx.launch with several ranks the model is sharded over them (week 4 day 1):
every rank runs the same prompts on the same engine, and only rank 0 prints
(scripts/commands/ranks.py).
"""

from scripts.commands.interrupt import exit_on_interrupt, unwind_on_interrupt

exit_on_interrupt()  # first: Ctrl-C during the imports below never shows a traceback

import argparse  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import tiny_llm_base  # noqa: E402, F401  (before mlx.core: loads the fast BLAS)
from rich.console import Console  # noqa: E402
from rich.live import Live  # noqa: E402

from scripts.commands.solution import (  # noqa: E402
    add_solution_option,
    check_solution,
    solution_package,
)
from scripts.commands.batch_view import (  # noqa: E402
    live_view,
    print_failures,
    print_summary,
)
from scripts.commands.cli import (  # noqa: E402
    fail,
    fail_with_options,
    option_parser,
    require_at_least,
    require_model_name,
)
from scripts.commands.engine_log import EngineLog, kv_cache_line  # noqa: E402
from scripts.commands.engine_options import (  # noqa: E402
    ENGINE_OPTIONS,
    add_kv_memory_option,
    add_scheduling_options,
    check_kv_dtype,
    check_scheduling_options,
    parse_kv_memory,
    parse_prefill_step,
    parse_token_budget,
    scheduling_settings,
)
from scripts.commands.model_loading import (  # noqa: E402
    context_length,
    load_model_or_exit,
    newest_model,
    note_slow_blas,
)
from scripts.commands.probes import newest_kv_cache, newest_policy  # noqa: E402
from scripts.commands.constraints import (  # noqa: E402
    add_constraint_options,
    check_constraint,
    constrained_prompts,
    constraint_option,
)
from scripts.commands.ranks import (  # noqa: E402
    agreed_num_blocks,
    budget_source,
    join_ranks,
    quiet_unless_rank_zero,
    sharded_model,
)

DEFAULT_PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about autumn leaves.",
    "Explain in two sentences why the sky is blue.",
    "List five animals that live in the ocean.",
    "Hi!",
    "Give me three tips for learning a new language.",
    "What is 17 multiplied by 23? Show your steps.",
    (
        "Summarize the following text in one sentence. The printing press, developed "
        "by Johannes Gutenberg around 1440, combined movable metal type, oil-based inks "
        "and a screw press adapted from wine making. Before it, books were copied by hand, "
        "which made them rare and expensive. Within fifty years presses were working in "
        "more than two hundred European cities and had produced millions of volumes. "
        "Cheaper books spread literacy beyond the clergy and the nobility, helped "
        "scientists share and check each other's results, and let new religious and "
        "political ideas travel faster than any authority could suppress them. Historians "
        "often count it among the inventions that opened the modern age."
    ),
    "Write a short story opening about a lighthouse keeper who finds a letter.",
    "What are the differences between a list and a tuple in Python?",
]


def parse_args() -> argparse.Namespace:
    parser = option_parser("Generate for many prompts with continuous batching.")
    parser.add_argument(
        "--model", help="local model folder or Hub repo id (default: embedded SmolLM2)"
    )
    parser.add_argument("--prompts-file", help="a text file with one prompt per line")
    parser.add_argument("--batch-size", type=int, default=5)
    parser.add_argument(
        "--prefill-step",
        default="128",
        help="prompt tokens per prefill chunk, or 'none' to prefill whole prompts",
    )
    add_scheduling_options(parser)
    parser.add_argument(
        "--token-budget",
        help="with --policy mixed: the most tokens one step runs, decodes included "
        "(default: no limit; --prefill-step still caps one request's chunk)",
    )
    parser.add_argument(
        "--kv-cache",
        choices=("paged", "dense"),
        help="paged: a pool of blocks shared by every request (week 3 day 2; the "
        "default once the package has it); dense: max-seq-len positions per slot "
        "(week 2)",
    )
    parser.add_argument("--block-size", type=int, default=16)
    add_kv_memory_option(parser)
    parser.add_argument(
        "--no-prefix-caching",
        action="store_true",
        help="with --kv-cache paged: compute every prompt whole (week 3 day 3 off)",
    )
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--max-seq-len", type=int, default=512)
    add_solution_option(parser)
    add_constraint_options(parser)
    args = parser.parse_args()
    require_model_name(args.model)
    require_at_least(
        args, 1, "--batch-size", "--max-tokens", "--max-seq-len", "--block-size"
    )
    args.prefill_step = parse_prefill_step(args.prefill_step)
    args.token_budget = parse_token_budget(args)
    check_scheduling_options(args)
    args.kv_memory = parse_kv_memory(args.kv_memory)
    check_solution(args)
    args.prompts = read_prompts(args.prompts_file) if args.prompts_file else None
    return args


def policy_name(args: argparse.Namespace) -> str:
    if args.policy == "alternate":
        return "policy alternate"
    budget = "no limit" if args.token_budget is None else args.token_budget
    return f"policy mixed, token budget {budget}"


def read_prompts(path: str) -> list[str]:
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as error:
        fail(f"cannot read --prompts-file {path}: {error.strerror}")
    except UnicodeDecodeError:
        fail(f"--prompts-file {path} is not UTF-8 text")
    prompts = [line.strip() for line in lines if line.strip()]
    if not prompts:
        fail(f"--prompts-file {path} has no prompts: write one prompt per line")
    return prompts


def run(
    package, model, tokenizer, prompts, args, prefix_caching: bool, console: Console
):
    def generate(on_step):
        return package.batch_generate(
            model,
            tokenizer,
            prompts,
            batch_size=args.batch_size,
            prefill_step=args.prefill_step,
            max_seq_len=args.max_seq_len,
            max_tokens=args.max_tokens,
            on_step=on_step,
            token_budget=args.token_budget,
            **scheduling_settings(args, args.policy, package, model),
            kv_cache=args.kv_cache,
            block_size=args.block_size,
            kv_memory=args.kv_memory,
            num_blocks=args.num_blocks,
            prefix_caching=prefix_caching,
            kv_dtype=args.kv_dtype,
        )

    said = []

    def say_kv_cache(snapshot, write) -> None:
        """The KV cache's size in tokens, once: the first snapshot has the pool's."""
        if not said:
            said.append(True)
            write(
                kv_cache_line(
                    snapshot.metrics,
                    model,
                    args.batch_size,
                    args.max_seq_len,
                    args.kv_memory,
                    args.num_blocks,
                    args.kv_source,
                    args.kv_dtype,
                )
            )

    if not console.is_terminal:

        def write(line: str) -> None:
            print(line, flush=True)

        log = EngineLog(write)

        def log_step(snapshot) -> None:
            say_kv_cache(snapshot, write)
            log.update(snapshot)

        return generate(log_step)
    with Live(console=console, auto_refresh=False, transient=True) as live:
        log = EngineLog(live.console.print)

        def on_step(snapshot) -> None:
            say_kv_cache(
                snapshot, lambda line: live.console.print(line, highlight=False)
            )
            log.update(snapshot)
            live.update(live_view(snapshot, policy_name(args)), refresh=True)

        return generate(on_step)


def clamp_max_seq_len(args, mlx_model) -> None:
    """A decode slot cannot hold more positions than the model was trained for."""
    limit = context_length(mlx_model)
    if args.max_seq_len > limit:
        print(
            f"note: --max-seq-len {args.max_seq_len} is beyond the model's context "
            f"of {limit} positions (max_position_embeddings): using {limit}",
            file=sys.stderr,
        )
        args.max_seq_len = limit


def main() -> None:
    unwind_on_interrupt()  # the imports are done
    quiet_unless_rank_zero()  # under mlx.launch: before anything is printed
    args = parse_args()
    prompts = args.prompts or DEFAULT_PROMPTS
    ranks = join_ranks()  # under mlx.launch: the other ranks, before the model
    note_slow_blas()
    mlx_model, tokenizer = load_model_or_exit(args.model)
    clamp_max_seq_len(args, mlx_model)
    package = solution_package(args.solution)
    # Fast kernels are week 2 day 3; a learner's days 1-2 model runs without them.
    kinds = ["week2-fast", "week2"] if args.solution == "learner" else ["week2-fast"]
    console = Console()
    args.num_blocks = args.kv_source = None
    try:
        if ranks.sharded:
            model = sharded_model(package, mlx_model, ranks, args.solution)
        else:
            model, _ = newest_model(package, mlx_model, kinds)
        args.kv_cache, prefix_caching = newest_kv_cache(
            package, args.kv_cache, not args.no_prefix_caching
        )
        check_kv_dtype(args)
        args.policy = newest_policy(package, args.policy)
        if ranks.sharded and args.kv_cache == "paged":
            args.num_blocks = agreed_num_blocks(
                package,
                model,
                ranks,
                args.batch_size,
                args.max_seq_len,
                args.block_size,
                args.kv_memory,
                args.kv_dtype,
            )
            args.kv_source = budget_source(ranks, args.kv_memory)
            args.kv_memory = None
        constraint = constraint_option(args, package)
        check_constraint(constraint, package, tokenizer, model.vocab_size)
        prompts = constrained_prompts(prompts, constraint)
        results = run(package, model, tokenizer, prompts, args, prefix_caching, console)
    except NotImplementedError as error:
        fail(f"not implemented yet in src/tiny_llm: {error}", status=1)
    except (TypeError, ValueError) as error:
        fail_with_options(error, (*ENGINE_OPTIONS, "--max-tokens"))
    print_summary(results, console, policy_name(args))
    if print_failures(results):
        sys.exit(1)


if __name__ == "__main__":
    main()
