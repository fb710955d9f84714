"""Our server beside mlx_lm.server, same model folder, same workload: `pdm run bench-serve`.

pdm run bench-serve                       # the side-by-side run, then the soak
pdm run bench-serve --skip-soak --requests 20
pdm run bench-serve --soak-only

One script run starts each server in turn on 127.0.0.1 (ours: scripts/commands/serve.py;
the peer: mlx_lm.server on the embedded model's folder, with the fast BLAS loaded
first as for ours), warms it with one request, sends it the load test's workload at
the same arrival rate, and stops it. The goal: our TTFT p99 and ITL p99 at most
0.8x mlx_lm.server's, with zero errors. The soak then sends our server 300 requests
of which 20% hang up early: it passes with zero server errors, nothing running or
waiting afterwards, and MLX's active memory within 5% of where it started.
Writes a table, JSON (--out) and plots (serving-*.png beside the JSON; into
book/src/images with --book-figures).
"""

from scripts.commands.interrupt import exit_on_interrupt

exit_on_interrupt()  # first: Ctrl-C during the imports below never shows a traceback

import argparse
import asyncio
from pathlib import Path

from scripts.bench.benchlib.course import run_benchmark
from scripts.bench.benchlib.harness import Bench
from scripts.bench.benchlib.goals import Goal, at_most
from scripts.bench.benchlib.servers import Server, ours, peer
from scripts.commands.ports import free_port
from scripts.bench.loadlib import report
from scripts.bench.loadlib.client import run_load
from scripts.bench.loadlib.workload import make_workload
from scripts.commands.cli import fail
from scripts.commands.load_test import (
    add_workload_arguments,
    check_workload_arguments,
    workload_of,
)

GOAL_RATIO = 0.8
MEMORY_TOLERANCE = 0.05


def start_ours(args, port: int) -> Server:
    options = ["--batch-size", str(args.batch_size)]
    if args.policy:
        options += ["--policy", args.policy]
    if args.policy != "alternate" and args.token_budget:
        options += ["--token-budget", str(args.token_budget)]
    if args.kv_cache:
        options += ["--kv-cache", args.kv_cache]
    return ours(port, args.solution, *options)


def start_peer(args, port: int) -> Server:
    concurrency = args.peer_concurrency or args.batch_size
    return peer(port, concurrency, float32=args.peer_weights == "float32")


def load(server: Server, requests, args):
    warm = make_workload(1, 1.0, 4, long_fraction=0.0, seed=99)
    asyncio.run(run_load(server.url, warm, 1, 120))
    outcomes, wall = asyncio.run(
        run_load(server.url, requests, args.concurrency, args.time_limit)
    )
    return outcomes, report.summarize(server.name, outcomes, wall)


def side_by_side_goals(mine: dict, theirs: dict) -> list[Goal]:
    goals = []
    for key, label, unit in (
        ("ttft_p99_s", "TTFT p99", "s"),
        ("itl_p99_ms", "ITL p99", "ms"),
    ):
        ratio = mine[key] / theirs[key] if theirs[key] else float("nan")
        why = f"ours {mine[key]:.3g} {unit} vs mlx_lm.server {theirs[key]:.3g} {unit}"
        goals.append(at_most(f"{label}, ours / mlx_lm.server", ratio, GOAL_RATIO, why))
    why = (
        f"ours {mine['errors']} of {mine['requests']}, mlx_lm.server {theirs['errors']}"
    )
    share = mine["errors"] / mine["requests"]
    return goals + [at_most("requests that failed, ours", share, 0, why)]


def soak(args, console, image: Path) -> tuple[dict, list[Goal]]:
    """300 requests, 20% cancelled early, against a fresh server of ours; the plot
    to `image`."""
    with start_ours(args, free_port()) as server:
        warm = make_workload(args.batch_size, 50.0, 8, long_fraction=0.5, seed=98)
        asyncio.run(run_load(server.url, warm, args.batch_size, 300))
        before = server.metrics()
        requests = make_workload(
            args.soak_requests,
            args.soak_rate,
            args.soak_max_tokens,
            long_fraction=0.1,
            long_notes=args.long_notes,
            cancel_fraction=args.soak_cancel,
            seed=args.seed + 1,
        )
        outcomes, wall = asyncio.run(
            run_load(server.url, requests, args.concurrency, args.soak_time_limit)
        )
        after = server.settled(60)
    summary = report.summarize("tiny-llm soak", outcomes, wall)

    def grew(name: str) -> float:
        return after[name] - before[name]

    finished = 'tiny_llm:request_success_total{{finished_reason="{}"}}'
    memory = "tiny_llm:mlx_active_memory_bytes"
    server_errors = summary["server_errors"] + int(grew(finished.format("error")))
    aborted = grew(finished.format("abort"))
    summary.update(
        memory_before_mb=before[memory] / 2**20,
        memory_after_mb=after[memory] / 2**20,
        memory_change=grew(memory) / before[memory],
        running_after=after["tiny_llm:num_requests_running"],
        waiting_after=after["tiny_llm:num_requests_waiting"],
        server_errors=server_errors,
        aborted_by_server=aborted,
    )
    n, errors, examples = (summary[k] for k in ("requests", "errors", "error_examples"))
    mib = f"{summary['memory_before_mb']:.0f} -> {summary['memory_after_mb']:.0f} MiB"
    change = abs(summary["memory_change"])
    running, waiting = summary["running_after"], summary["waiting_after"]
    busy, left = running + waiting, f"running {running:.0f}, waiting {waiting:.0f}"
    goals = [
        at_most(
            "soak: server errors / requests",
            server_errors / n,
            0,
            f"{server_errors} of {n}",
        ),
        at_most(
            "soak: failed requests / requests",
            errors / n,
            0,
            f"{errors} of {n}" + (f": {examples}" if examples else ""),
        ),
        at_most("soak: requests left running or waiting", busy, 0, left),
        at_most(
            "soak: MLX active memory change (a share)", change, MEMORY_TOLERANCE, mib
        ),
    ]
    summary["passed"] = all(goal.met for goal in goals)
    console.print(report.table("soak", [summary]))
    console.print(
        f"soak: {n} requests, {summary['cancelled']} cancelled by their clients "
        f"({aborted:.0f} aborted by the server), {errors} errors, {server_errors} "
        f"server errors; {left} afterwards; MLX active memory {mib} "
        f"({100 * summary['memory_change']:+.1f}%)"
    )
    report.plot(image, {"tiny-llm soak": outcomes}, "soak")
    return summary, goals


def check_options(args: argparse.Namespace) -> None:
    """Every option in range before a server starts: one `error:` line, status 2."""
    check_workload_arguments(args)
    if args.policy != "alternate" and 0 < args.token_budget <= args.batch_size:
        fail(
            f"--token-budget must be more than --batch-size ({args.batch_size}), or "
            f"0 for no limit, got {args.token_budget}"
        )
    if args.skip_soak and args.soak_only:
        fail("--skip-soak and --soak-only leave nothing to run: give one of them")


def main() -> int:
    bench = Bench(__doc__, out="bench-serve.json")
    add_workload_arguments(bench.parser)
    bench.parser.set_defaults(requests=30, rate=0.3, max_tokens=24, long_notes=8)
    bench.option("--batch-size", 8, least=1)
    help = "ours' policy (default: what pdm run serve picks)"
    bench.option("--policy", None, help, choices=("alternate", "mixed"))
    help = "ours, mixed policy (default 0: no limit, as pdm run serve)"
    bench.option("--token-budget", 0, help, least=0)
    help = "ours' KV cache (default: what pdm run serve picks)"
    bench.option("--kv-cache", None, help, choices=("paged", "dense"))
    help = "mlx_lm.server's --decode-concurrency and --prompt-concurrency (default: "
    bench.option("--peer-concurrency", None, help + "--batch-size)", type=int, least=1)
    help = "folder: the embedded folder as it is (4-bit); float32: the same weights "
    help += "as ours, dequantized"
    bench.option("--peer-weights", "folder", help, choices=("folder", "float32"))
    bench.option("--skip-soak", False)
    bench.option("--soak-only", False)
    bench.option("--soak-requests", 300, least=1)
    bench.option("--soak-rate", 3.0, positive=True)
    bench.option("--soak-max-tokens", 8, least=1)
    bench.option("--soak-cancel", 0.2, fraction=True)
    bench.option("--soak-time-limit", 900.0, positive=True)
    args = bench.parse()
    check_options(args)
    console = bench.start()
    record = {"arguments": {k: str(v) for k, v in vars(args).items()}}
    goals = []
    if not args.soak_only:
        requests = workload_of(args)
        runs, summaries = {}, []
        for start in (start_ours, start_peer):
            with start(args, free_port()) as server:
                outcomes, summary = load(server, requests, args)
            runs[server.name] = outcomes
            summaries.append(summary)
        title = (
            f"{args.requests} requests at {args.rate}/s, {args.max_tokens} tokens each, "
            f"{int(100 * args.long_fraction)}% long (~{27 * args.long_notes} tokens)"
        )
        console.print(report.table(title, summaries))
        goals += side_by_side_goals(*summaries)
        record["side_by_side"] = summaries
        report.plot(bench.image("serving-load.png"), runs, title)
    if not args.skip_soak:
        record["soak"], soak_goals = soak(
            args, console, bench.image("serving-soak.png")
        )
        goals += soak_goals
    return bench.finish(record, goals, [bench.image("serving-*.png")])


if __name__ == "__main__":
    run_benchmark(main)
