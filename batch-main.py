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
from rich.console import Console, Group  # noqa: E402
from rich.live import Live  # noqa: E402
from rich.progress_bar import ProgressBar  # noqa: E402
from rich.table import Table  # noqa: E402
from rich.text import Text  # noqa: E402

from scripts.commands.solution import (  # noqa: E402
    add_solution_option,
    check_solution,
    solution_package,
)
from scripts.commands.cli import (  # noqa: E402
    STEP_LIMIT_OPTIONS,
    EngineLog,
    add_kv_memory_option,
    check_kv_dtype,
    add_scheduling_options,
    check_scheduling_options,
    context_length,
    fail,
    fail_with_options,
    kv_cache_line,
    load_model_or_exit,
    newest_kv_cache,
    newest_model,
    newest_policy,
    note_slow_blas,
    option_parser,
    parse_kv_memory,
    require_at_least,
    require_model_name,
    scheduling_settings,
)
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

# The options that set an engine argument of the same name: its errors name them.
ENGINE_OPTIONS = (
    "--batch-size",
    "--max-seq-len",
    "--max-tokens",
    "--prefill-step",
    "--token-budget",
    "--kv-cache",
    "--block-size",
    "--kv-memory",
    "--kv-dtype",
    *STEP_LIMIT_OPTIONS,
    "--batch-patience",
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


def parse_prefill_step(value: str) -> int | None:
    if value.strip().lower() == "none":
        return None
    try:
        step = int(value)
    except ValueError:
        fail(f"--prefill-step must be a number of tokens or 'none', got {value!r}")
    if step < 1:
        fail(f"--prefill-step must be at least 1 (or 'none'), got {step}")
    return step


def parse_token_budget(args: argparse.Namespace) -> int | None:
    """A mixed step's budget: room for one decode token per slot and a prefill token."""
    if args.token_budget is None or args.token_budget.strip().lower() == "none":
        return None
    if args.policy == "alternate":
        fail("--token-budget limits a mixed step: add --policy mixed")
    try:
        budget = int(args.token_budget)
    except ValueError:
        fail(f"--token-budget must be a number of tokens, got {args.token_budget!r}")
    if budget <= args.batch_size:
        fail(
            f"--token-budget must be more than --batch-size ({args.batch_size}): each "
            f"step runs one decode token per slot and needs room for a prompt token, "
            f"got {budget}"
        )
    return budget


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


def one_line(text: str) -> str:
    return text.replace("\n", " ").replace("\r", " ")


def live_view(snapshot, policy: str) -> Group:
    """The decode slots, the request being prefilled, and the finished requests."""
    slots = Table(title=f"decode slots (step {snapshot.step}, {policy})", expand=True)
    slots.add_column("slot", justify="right")
    slots.add_column("request", justify="right")
    slots.add_column("priority")
    slots.add_column("position", justify="right")
    slots.add_column("generated", justify="right")
    slots.add_column("text so far", ratio=1, no_wrap=True, overflow="ellipsis")
    for number, view in enumerate(snapshot.slots):
        if view is None:
            slots.add_row(str(number), "-", "", "", "", Text("(free)", style="dim"))
        else:
            slots.add_row(
                str(number),
                f"#{view.request}",
                view.priority,
                str(view.offset),
                str(view.generated),
                one_line(view.text_tail),
            )
    progress = Table.grid(padding=(0, 1))
    progress.add_column(width=12)
    progress.add_column(width=40)
    progress.add_column()
    if snapshot.prefilling is None:
        progress.add_row("prefilling", "", Text("-", style="dim"))
    else:
        request, offset, prompt_tokens = snapshot.prefilling
        progress.add_row(
            "prefilling",
            ProgressBar(total=prompt_tokens, completed=offset),
            f"#{request}: {offset}/{prompt_tokens} prompt tokens",
        )
    progress.add_row(
        "finished",
        ProgressBar(total=snapshot.total, completed=snapshot.finished),
        f"{snapshot.finished}/{snapshot.total} requests",
    )
    return Group(slots, progress)


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
            **scheduling_settings(args, args.policy, package),
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


def print_summary(results, console: Console, policy: str) -> None:
    table = Table(title="results", expand=True)
    table.add_column("#", justify="right")
    table.add_column("finish")
    table.add_column("prompt", justify="right")
    table.add_column("tokens", justify="right")
    table.add_column("TTFT", justify="right")
    table.add_column("answer", ratio=1, no_wrap=True, overflow="ellipsis")
    for number, result in enumerate(results):
        ttft = result.metrics.time_to_first_token
        answer = result.error if result.error else one_line(result.text)
        table.add_row(
            str(number),
            result.finish_reason,
            str(result.metrics.prompt_tokens),
            str(len(result.tokens)),
            "-" if ttft is None else f"{ttft:.2f} s",
            answer,
        )
    console.print(table)
    metrics = results.metrics
    prompt_tokens = sum(r.metrics.prompt_tokens for r in results)
    generated = sum(len(r.tokens) for r in results)
    seconds = max(metrics.total_seconds, 1e-9)  # 0 when every prompt failed at once
    console.print(
        f"{len(results)} requests in {metrics.total_seconds:.1f} s: "
        f"{prompt_tokens} prompt tokens ({prompt_tokens / seconds:.1f} tokens/s), "
        f"{generated} generated tokens ({generated / seconds:.1f} tokens/s); "
        f"{policy}: {metrics.prefill_chunks} prefill chunks, "
        f"{metrics.decode_steps} decode steps, "
        f"longest decode stall {1000 * metrics.longest_decode_stall:.0f} ms, "
        f"peak memory {metrics.peak_memory_bytes / 2**20:.0f} MiB",
        highlight=False,
    )
    if metrics.kv_blocks_total:
        console.print(
            f"paged KV: peak {metrics.kv_peak_blocks_in_use} of "
            f"{metrics.kv_blocks_total} blocks of {metrics.kv_block_size} "
            f"({metrics.kv_peak_tokens} positions of a "
            f"{metrics.kv_blocks_total * metrics.kv_block_size:,}-token budget, "
            f"{metrics.kv_peak_tokens * metrics.kv_bytes_per_token / 2**20:.1f} MiB) "
            f"against {metrics.kv_dense_tokens} dense "
            f"({100 * metrics.kv_peak_tokens / metrics.kv_dense_tokens:.0f}%); "
            f"prefix cache hit rate {100 * metrics.prefix_cache_hit_rate:.0f}% "
            f"({metrics.prefix_cached_tokens} of {metrics.prefix_prompt_tokens} "
            f"prompt tokens); {metrics.preemptions} preemptions",
            highlight=False,
        )
    if metrics.drafts:
        console.print(
            f"speculative decoding: {metrics.draft_tokens} draft tokens in "
            f"{metrics.drafts} verifications, {metrics.accepted_draft_tokens} accepted "
            f"({100 * metrics.draft_acceptance_rate:.0f}%), mean accepted length "
            f"{metrics.mean_accepted_length:.2f} tokens a step",
            highlight=False,
        )


def print_failures(results) -> int:
    """Each failed request's whole error on stderr (the table cuts it); their count."""
    failed = [(n, r) for n, r in enumerate(results) if r.finish_reason == "error"]
    for number, result in failed:
        print(f"request #{number} failed: {result.error}", file=sys.stderr)
    return len(failed)


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
        fail_with_options(error, ENGINE_OPTIONS)
    print_summary(results, console, policy_name(args))
    if print_failures(results):
        sys.exit(1)


if __name__ == "__main__":
    main()
