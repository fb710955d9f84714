"""Load-test an OpenAI-compatible server on this machine: `pdm run load-test --url URL`.

pdm run load-test --url http://127.0.0.1:8000
pdm run load-test --url http://127.0.0.1:8000 --requests 100 --rate 2 --cancel 0.2

Bounded: a fixed number of requests, at most --concurrency in flight, and a time
limit after which whatever is open counts as an error. Short questions and long
prompts arrive as a Poisson process at --rate requests per second. Prints a table
of TTFT and ITL p50/p99, requests/s, tokens/s and errors; writes JSON and a plot.
"""

import argparse
import asyncio
import sys
from pathlib import Path

from rich.console import Console

from scripts.bench.benchlib.record import out_path, unwritable
from scripts.bench.loadlib import report
from scripts.bench.loadlib.client import Unreachable, require_loopback, run_load
from scripts.bench.loadlib.workload import make_workload
from scripts.commands.cli import (
    fail,
    option_parser,
    require_at_least,
    require_fraction,
    require_positive,
)


def add_workload_arguments(parser: argparse.ArgumentParser) -> None:
    """The workload's options, shared with bench_serve.py."""
    parser.add_argument("--requests", type=int, default=40, help="how many requests")
    parser.add_argument("--rate", type=float, default=1.0, help="arrivals per second")
    parser.add_argument("--concurrency", type=int, default=16, help="most in flight")
    parser.add_argument("--max-tokens", type=int, default=32, help="per request")
    parser.add_argument("--long-fraction", type=float, default=0.25)
    parser.add_argument(
        "--long-notes",
        type=int,
        default=12,
        help="notes in a long prompt (~27 tokens each)",
    )
    parser.add_argument(
        "--cancel",
        type=float,
        default=0.0,
        help="fraction of clients that hang up early",
    )
    parser.add_argument("--time-limit", type=float, default=300.0, help="seconds")
    parser.add_argument("--seed", type=int, default=0)


def check_workload_arguments(args: argparse.Namespace) -> None:
    """The workload's options, each refused with one `error:` line when out of range."""
    require_at_least(
        args, 1, "--requests", "--concurrency", "--max-tokens", "--long-notes"
    )
    require_positive(args, "--rate", "--time-limit")
    require_fraction(args, "--long-fraction", "--cancel")


def workload_of(args: argparse.Namespace):
    return make_workload(
        args.requests,
        args.rate,
        args.max_tokens,
        args.long_fraction,
        args.long_notes,
        args.cancel,
        args.seed,
    )


def main() -> None:
    parser = option_parser(__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="e.g. http://127.0.0.1:8000")
    parser.add_argument("--api-key")
    parser.add_argument("--model", help="model id to send (default: GET /v1/models)")
    parser.add_argument("--name", default="server", help="the server's name in reports")
    outputs = {"--json": "load-test.json", "--plot": "load-test.png"}
    for option, name in outputs.items():
        parser.add_argument(option, type=out_path, default=Path(name))
    add_workload_arguments(parser)
    args = parser.parse_args()
    check_workload_arguments(args)
    for option, name in outputs.items():  # found out now, not after the run
        problem = unwritable(getattr(args, option[2:]), name)
        if problem is not None:
            fail(f"{option} {problem}")
    try:
        require_loopback(args.url)
    except ValueError as error:
        fail(str(error))
    requests = workload_of(args)
    try:
        outcomes, wall = asyncio.run(
            run_load(
                args.url,
                requests,
                args.concurrency,
                args.time_limit,
                args.api_key,
                args.model,
            )
        )
    except Unreachable as error:  # nothing measured: no record, no plot
        fail(
            f"{error}: is the server running? Start it with `pdm run serve`, or "
            "give its address with --url",
            status=1,
        )
    summary = report.summarize(args.name, outcomes, wall)
    Console(width=150).print(report.table(f"load test: {args.url}", [summary]))
    for example in summary["error_examples"]:
        print(f"error: {example}", file=sys.stderr)
    report.write_json(
        args.json,
        {
            "arguments": vars(args) | {"json": str(args.json), "plot": str(args.plot)},
            "summary": summary,
        },
    )
    report.plot(
        args.plot,
        {args.name: outcomes},
        f"{args.name}: {args.requests} requests at {args.rate}/s",
    )
    print(f"wrote {args.json} and {args.plot}", file=sys.stderr)
    sys.exit(1 if summary["errors"] else 0)


if __name__ == "__main__":
    main()
