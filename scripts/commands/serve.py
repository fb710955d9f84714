"""Serve a model with an OpenAI-compatible API: `pdm run serve`.

pdm run serve                                  # the embedded model on 127.0.0.1:8000
pdm run serve --token-budget 256 --batch-size 8  # a mixed step of at most 256 tokens
pdm run serve --max-num-partial-prefills 1     # one prompt prefilled at a time
pdm run serve --kv-memory 2GiB                 # the paged pool's budget (default: half
                                               # the available memory)
pdm run serve --kv-disk-dir ~/.cache/tiny-llm-kv  # conversations survive a restart
pdm run serve --solution learner --api-key secret
pdm run mlx.launch -n 2 --backend ring -- python -m scripts.commands.serve
                                               # tensor parallel: rank 0 listens

Then open http://127.0.0.1:8000/ for the chat page, or call it with curl or the
openai client (base_url http://127.0.0.1:8000/v1). Every LOG_INTERVAL seconds of
work prints the engine's log line, as batch-main does.
"""

from scripts.commands.interrupt import (
    exit_on_interrupt,
    stop_gracefully_within,
    unwind_on_interrupt,
)

exit_on_interrupt()  # first: Ctrl-C during the imports below never shows a traceback

import argparse  # noqa: E402
import errno  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

from scripts.commands.solution import (  # noqa: E402
    add_solution_option,
    check_solution,
    solution_package,
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
    scheduling_settings,
)
from scripts.commands.model_loading import (  # noqa: E402
    context_length,
    load_model_or_exit,
    newest_model,
    note_slow_blas,
)
from scripts.commands.probes import newest_kv_cache, newest_policy  # noqa: E402
from scripts.commands.ranks import (  # noqa: E402
    Ranks,
    agreed_num_blocks,
    budget_source,
    join_ranks,
    quiet_unless_rank_zero,
    refuse_clock_decisions,
    sharded_model,
)

# The options that set an engine argument of the same name: its errors name them.
SERVE_ENGINE_OPTIONS = (
    *ENGINE_OPTIONS,
    "--reserved-interactive-slots",
    "--num-blocks",
    "--kv-disk-dir",
    "--kv-disk-budget",
)


def parse_args() -> argparse.Namespace:
    parser = option_parser("Serve a model over the OpenAI API.")
    parser.add_argument(
        "--model", help="local model folder or Hub repo id (default: embedded SmolLM2)"
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default: loopback only)"
    )
    parser.add_argument("--port", type=int, default=8000)
    add_solution_option(parser)
    parser.add_argument("--batch-size", type=int, default=8, help="decode slots")
    parser.add_argument(
        "--prefill-step",
        default="128",
        help="prompt tokens per prefill chunk, or 'none' for whole prompts",
    )
    add_scheduling_options(parser)
    parser.add_argument(
        "--token-budget", type=int, help="with --policy mixed: tokens per step"
    )
    parser.add_argument(
        "--max-seq-len", type=int, help="positions per slot (default: the model's)"
    )
    parser.add_argument(
        "--kv-cache",
        choices=("paged", "dense"),
        help="paged: blocks shared by every request (the default once the package "
        "has week 3 day 2); dense: max-seq-len positions per slot",
    )
    parser.add_argument("--block-size", type=int, default=16)
    add_kv_memory_option(parser)
    parser.add_argument(
        "--num-blocks",
        type=int,
        help="with --kv-cache paged: the pool's size in blocks, instead of --kv-memory",
    )
    parser.add_argument(
        "--no-prefix-caching",
        action="store_true",
        help="with --kv-cache paged: compute every prompt whole",
    )
    parser.add_argument(
        "--kv-disk-dir",
        metavar="FOLDER",
        help="with prefix caching: keep computed KV blocks in this folder (written "
        "when the pool evicts them and at shutdown), so that a restarted server "
        "finds the conversations it had computed",
    )
    parser.add_argument(
        "--kv-disk-budget",
        metavar="SIZE",
        help="with --kv-disk-dir: the most the folder's files take, e.g. 8GiB, least "
        "recently used out first (default 4GiB)",
    )
    parser.add_argument(
        "--reserved-interactive-slots",
        type=int,
        default=1,
        help="slots only interactive (chat) requests may take",
    )
    parser.add_argument(
        "--max-waiting",
        type=int,
        default=64,
        help="requests waiting for their first token past which new ones get 503",
    )
    parser.add_argument(
        "--api-key",
        default=os.environ.get("TINY_LLM_API_KEY"),
        help="require 'Authorization: Bearer KEY' on /v1 (default: $TINY_LLM_API_KEY)",
    )
    parser.add_argument(
        "--model-name",
        help="the model id clients send (default: the model folder's name)",
    )
    args = parser.parse_args()
    require_model_name(args.model)
    if args.model_name is not None and not args.model_name.strip():
        fail(
            "--model-name is empty: give the id clients should send, or leave "
            "--model-name out to serve under the model folder's name"
        )
    check_solution(args)
    if not 0 < args.port < 65536:
        fail(f"--port must be in 1..65535, got {args.port}")
    require_at_least(
        args, 1, "--batch-size", "--max-waiting", "--max-seq-len", "--block-size"
    )
    require_at_least(args, 1, "--num-blocks")
    if args.kv_memory is not None and args.num_blocks is not None:
        fail("--num-blocks and --kv-memory both size the pool: pass one of them")
    args.kv_memory = parse_kv_memory(args.kv_memory)
    if args.kv_disk_budget is not None and args.kv_disk_dir is None:
        fail("--kv-disk-budget sizes the disk tier: add --kv-disk-dir")
    args.prefill_step = parse_prefill_step(args.prefill_step)
    if args.token_budget is not None and args.policy == "alternate":
        fail("--token-budget limits a mixed step: add --policy mixed")
    check_scheduling_options(args)
    if args.api_key is not None and not args.api_key.strip():
        fail("--api-key is empty: give a key, or leave it out to serve without one")
    return args


def build_engine(package, mlx_model, tokenizer, args, ranks: Ranks):
    """The package's Engine on its newest model (sharded under several ranks); bad
    settings exit with one line."""
    kinds = ["week2-fast", "week2"] if args.solution == "learner" else ["week2-fast"]
    limit = context_length(mlx_model)
    max_seq_len = limit if args.max_seq_len is None else args.max_seq_len
    if max_seq_len > limit:
        fail(f"--max-seq-len {max_seq_len} is beyond the model's context of {limit}")
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
        if args.kv_disk_dir is not None and not (
            args.kv_cache == "paged" and prefix_caching
        ):
            fail(
                "--kv-disk-dir keeps the prefix cache's blocks: it needs --kv-cache "
                "paged with prefix caching (no --no-prefix-caching; a learner's "
                "package from week 3 day 3 on)"
            )
        share_pool(package, model, ranks, args, max_seq_len)
        return package.Engine(
            model,
            tokenizer,
            batch_size=args.batch_size,
            max_seq_len=max_seq_len,
            prefill_step=args.prefill_step,
            token_budget=args.token_budget,
            **scheduling_settings(args, args.policy, package, model),
            reserved_interactive_slots=args.reserved_interactive_slots,
            kv_cache=args.kv_cache,
            block_size=args.block_size,
            num_blocks=args.num_blocks,
            kv_memory=args.kv_memory,
            prefix_caching=prefix_caching,
            **kv_disk_settings(args),
            kv_dtype=args.kv_dtype,
        )
    except NotImplementedError as error:
        fail(f"not implemented yet in src/tiny_llm: {error}", status=1)
    except (TypeError, ValueError) as error:
        fail_with_options(error, SERVE_ENGINE_OPTIONS)


def main() -> None:
    quiet_unless_rank_zero()  # under mlx.launch: only rank 0 speaks
    args = parse_args()  # before the slow imports: a bad option fails at once
    import tiny_llm_base  # noqa: F401  (before mlx.core: loads the fast BLAS)

    from tiny_llm_serve import (
        ConstraintFactory,
        ServerSettings,
        create_app,
        listen_socket,
        serve,
    )

    from tiny_llm_serve.server import GRACE_S

    from scripts.commands.rank_server import (
        RankZeroEngine,
        follow,
        stop_other_ranks_with,
        watch_ranks,
    )

    unwind_on_interrupt()  # the imports are done

    ranks = join_ranks()  # under mlx.launch: the other ranks, before the model
    if ranks.sharded:
        refuse_clock_decisions(args)
        if args.kv_disk_dir is not None:
            fail(
                "--kv-disk-dir keeps one process's KV blocks, and under mlx.launch "
                "each rank holds a slice of every block: leave --kv-disk-dir out"
            )
    note_slow_blas()
    mlx_model, tokenizer = load_model_or_exit(args.model)
    package = solution_package(args.solution)
    engine = build_engine(package, mlx_model, tokenizer, args, ranks)
    if ranks.rank > 0:
        follow(engine, ranks, package.make_sampler)  # until rank 0 stops
    kv_line = kv_cache_line(
        engine.metrics,
        engine.model,
        engine.config.batch_size,
        engine.config.max_seq_len,
        engine.config.kv_memory,
        engine.config.num_blocks,
        getattr(args, "kv_source", None),
        engine.config.kv_dtype,
    )
    make_sampler = package.make_sampler
    if ranks.sharded:
        engine = RankZeroEngine(engine, ranks, package.make_sampler)
        make_sampler = engine.make_sampler
    try:  # after the settings' own errors, before anything says 'serving'
        sock = listen_socket(args.host, args.port)
    except OSError as error:
        in_use = error.errno == errno.EADDRINUSE
        fail(
            f"cannot listen on {args.host}:{args.port}: {error.strerror or error}; "
            + (
                "stop what uses it or choose another --port"
                if in_use
                else "check --host"
            ),
            status=1,
        )
    name = args.model_name or (
        Path(args.model).name if args.model else "SmolLM2-135M-Instruct"
    )
    settings = ServerSettings(name, api_key=args.api_key, max_waiting=args.max_waiting)

    def write(line: str) -> None:
        print(line, flush=True)
        app.state.engine_loop.status_page.last_log_line = line

    def started() -> None:
        print(
            f"serving {name} ({package.__name__}, policy {args.policy}, "
            f"{args.batch_size} slots, {args.kv_cache} KV cache"
            f"{', prefix caching' if engine.config.prefix_caching else ''}"
            f"{', disk tier' if engine.config.kv_disk_dir else ''}"
            f"{f', {ranks.size} ranks' if ranks.sharded else ''}) on "
            f"http://{args.host}:{args.port}/",
            file=sys.stderr,
            flush=True,
        )
        print(kv_line, file=sys.stderr, flush=True)
        if engine.config.kv_disk_dir is not None:
            print(disk_tier_line(engine), file=sys.stderr, flush=True)
        if not args.api_key:
            print(
                "note: no --api-key: anyone who can reach this address may generate "
                "with it; /engine shows positions but no request text",
                file=sys.stderr,
                flush=True,
            )

    constraints = ConstraintFactory.of(package)
    app = create_app(
        engine, settings, make_sampler, constraints, EngineLog(write).update
    )
    if ranks.sharded:
        stop_other_ranks_with(app.state.engine_loop, engine)
        watch_ranks(app.state.engine_loop, engine)
    # uvicorn's grace for open connections, then the engine thread's last step
    stop_gracefully_within(2 * GRACE_S)
    try:
        serve(app, sock, started)  # SIGTERM or Ctrl-C: open streams end with an error
    finally:
        # A stop signal can end serve() before the app's shutdown has joined the
        # engine thread; exiting with that thread inside MLX aborts the process.
        if app.state.engine_loop.thread.is_alive():
            app.state.engine_loop.stop()


def disk_tier_line(engine) -> str:
    """Where the disk tier keeps its blocks and how much it holds already."""
    from tiny_llm_base.memory import format_bytes

    disk = engine.kv.disk
    return (
        f"disk tier: {disk.folder}: {len(disk.names):,} blocks of this model, the "
        f"folder {format_bytes(disk.bytes_used)} of its "
        f"{format_bytes(disk.budget)} budget"
    )


def kv_disk_settings(args) -> dict:
    """The disk tier's engine settings, those given."""
    settings = {}
    if args.kv_disk_dir is not None:
        settings["kv_disk_dir"] = os.path.expanduser(args.kv_disk_dir)
    if args.kv_disk_budget is not None:
        settings["kv_disk_budget"] = args.kv_disk_budget
    return settings


# --- Several ranks (mlx.launch): see scripts/commands/ranks.py ---------------------


def share_pool(package, model, ranks: Ranks, args, max_seq_len: int) -> None:
    """Under several ranks, a paged pool not sized by --num-blocks gets the same
    number of blocks on every rank (agreed_num_blocks)."""
    if not ranks.sharded or args.kv_cache != "paged" or args.num_blocks is not None:
        return
    args.num_blocks = agreed_num_blocks(
        package,
        model,
        ranks,
        args.batch_size,
        max_seq_len,
        args.block_size,
        args.kv_memory,
        args.kv_dtype,
    )
    args.kv_source = budget_source(ranks, args.kv_memory)
    args.kv_memory = None


if __name__ == "__main__":
    main()
