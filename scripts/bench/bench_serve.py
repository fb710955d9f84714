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
Writes a table, JSON (--json) and plots (book/src/images/serving-*.png).
"""

import argparse
import asyncio
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
from rich.console import Console

from scripts.bench.loadlib import report
from scripts.bench.loadlib.client import run_load
from scripts.bench.loadlib.workload import make_workload
from scripts.commands.solution import add_solution_option, check_solution
from scripts.commands.cli import (
    fail,
    option_parser,
    require_at_least,
    require_fraction,
    require_positive,
)
from scripts.commands.load_test import (
    add_workload_arguments,
    check_workload_arguments,
    workload_of,
)

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ROOT / "book" / "src" / "images"
GOAL_RATIO = 0.8
MEMORY_TOLERANCE = 0.05
START_TIMEOUT_S = 180
# The peer imports the project first, like ours: the fast BLAS loads before mlx.core.
PEER = (
    "import sys, tiny_llm_base; from mlx_lm.server import main; "
    "sys.argv = ['mlx_lm.server'] + sys.argv[1:]; main()"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A server in a subprocess on 127.0.0.1, its output in a log file."""

    def __init__(self, name: str, command: list[str], port: int, ready_path: str):
        self.name = name
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = Path(f"/tmp/bench-serve-{name}-{port}.log")
        env = os.environ | {"PYTHONUNBUFFERED": "1"}
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen(
                command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"{name} exited while starting: see {self.log_path}")
            try:
                if httpx.get(self.url + ready_path, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{name} did not start in {START_TIMEOUT_S} s")
            time.sleep(0.5)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def metrics(self) -> dict[str, float]:
        """Our /metrics as {name{labels}: value} (the peer has none)."""
        values = {}
        for line in httpx.get(self.url + "/metrics", timeout=10).text.splitlines():
            match = re.fullmatch(r"(\S+) (\S+)", line)
            if match and not line.startswith("#"):
                values[match[1]] = float(match[2])
        return values


def ours(args, port: int) -> Server:
    command = [sys.executable, "-m", "scripts.commands.serve", "--port", str(port)]
    command += ["--batch-size", str(args.batch_size), "--solution", args.solution]
    if args.policy:
        command += ["--policy", args.policy]
    if args.policy != "alternate" and args.token_budget:
        command += ["--token-budget", str(args.token_budget)]
    if args.kv_cache:
        command += ["--kv-cache", args.kv_cache]
    return Server("tiny-llm", command, port, "/health")


def float32_folder(folder: Path) -> Path:
    """The model of `folder` with every weight in float32 (ours computes in float32),
    written once next to it, for a peer on the same weights as ours."""
    import mlx_lm
    from mlx_lm.utils import save_model

    from tiny_llm_base.mlx_lm_reference import float32_copy

    target = folder.with_name(folder.name + "-float32")
    if (target / "config.json").exists():
        return target
    model, _ = mlx_lm.load(str(folder))
    save_model(target, float32_copy(model))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(folder / name, target / name)
    config = json.loads((folder / "config.json").read_text())
    config.pop("quantization", None)
    config.pop("quantization_config", None)
    config["torch_dtype"] = "float32"
    (target / "config.json").write_text(json.dumps(config, indent=2))  # written last
    return target


def peer(args, port: int) -> Server:
    from tiny_llm_base.embedded_model import ensure_embedded_model

    folder = ensure_embedded_model()
    if args.peer_weights == "float32":
        folder = float32_folder(folder)
    command = [sys.executable, "-c", PEER, "--model", str(folder), "--port", str(port)]
    concurrency = str(args.peer_concurrency or args.batch_size)
    command += ["--host", "127.0.0.1", "--decode-concurrency", concurrency]
    command += ["--prompt-concurrency", concurrency]
    return Server("mlx_lm.server", command, port, "/v1/models")


def load(server: Server, requests, args):
    warm = make_workload(1, 1.0, 4, long_fraction=0.0, seed=99)
    asyncio.run(run_load(server.url, warm, 1, 120))
    outcomes, wall = asyncio.run(
        run_load(server.url, requests, args.concurrency, args.time_limit)
    )
    return outcomes, report.summarize(server.name, outcomes, wall)


def goal_lines(mine: dict, theirs: dict) -> list[str]:
    lines = []
    for key, label in (("ttft_p99_s", "TTFT p99"), ("itl_p99_ms", "ITL p99")):
        ratio = mine[key] / theirs[key] if theirs[key] else float("nan")
        met = ratio <= GOAL_RATIO
        lines.append(
            f"{label}: ours {mine[key]:.3g} vs mlx_lm.server {theirs[key]:.3g} = "
            f"{ratio:.2f}x (goal <= {GOAL_RATIO}x): {'met' if met else 'missed'}"
        )
    lines.append(
        f"errors: ours {mine['errors']} (goal 0): "
        f"{'met' if mine['errors'] == 0 else 'missed'}; mlx_lm.server "
        f"{theirs['errors']}"
    )
    return lines


def soak(args, console: Console) -> dict:
    """300 requests, 20% cancelled early, against a fresh server of ours."""
    server = ours(args, free_port())
    try:
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
        deadline = time.monotonic() + 60
        while True:
            after = server.metrics()
            idle = (
                after["tiny_llm:num_requests_running"] == 0
                and after["tiny_llm:num_requests_waiting"] == 0
            )
            if idle or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    finally:
        server.stop()
    summary = report.summarize("tiny-llm soak", outcomes, wall)
    memory_before = before["tiny_llm:mlx_active_memory_bytes"]
    memory_after = after["tiny_llm:mlx_active_memory_bytes"]
    server_errors = summary["server_errors"] + int(
        after['tiny_llm:request_success_total{finished_reason="error"}']
        - before['tiny_llm:request_success_total{finished_reason="error"}']
    )
    aborted = (
        after['tiny_llm:request_success_total{finished_reason="abort"}']
        - before['tiny_llm:request_success_total{finished_reason="abort"}']
    )
    summary.update(
        memory_before_mb=memory_before / 2**20,
        memory_after_mb=memory_after / 2**20,
        memory_change=(memory_after - memory_before) / memory_before,
        running_after=after["tiny_llm:num_requests_running"],
        waiting_after=after["tiny_llm:num_requests_waiting"],
        server_errors=server_errors,
        aborted_by_server=aborted,
    )
    passed = (
        server_errors == 0
        and summary["errors"] == 0
        and summary["running_after"] == 0
        and summary["waiting_after"] == 0
        and abs(summary["memory_change"]) <= MEMORY_TOLERANCE
    )
    summary["passed"] = passed
    console.print(report.table("soak", [summary]))
    console.print(
        f"soak: {summary['requests']} requests, {summary['cancelled']} cancelled by "
        f"their clients ({aborted:.0f} aborted by the server), {summary['errors']} "
        f"errors, {server_errors} server errors; running {summary['running_after']:.0f}"
        f" and waiting {summary['waiting_after']:.0f} afterwards; MLX active memory "
        f"{summary['memory_before_mb']:.0f} -> {summary['memory_after_mb']:.0f} MiB "
        f"({100 * summary['memory_change']:+.1f}%, goal within "
        f"{100 * MEMORY_TOLERANCE:.0f}%): {'passed' if passed else 'FAILED'}",
        highlight=False,
    )
    report.plot(IMAGES / "serving-soak.png", {"tiny-llm soak": outcomes}, "soak")
    return summary


def check_options(args: argparse.Namespace) -> None:
    """Every option in range before a server starts: one `error:` line, status 2."""
    check_workload_arguments(args)
    require_at_least(args, 1, "--batch-size", "--peer-concurrency")
    require_at_least(args, 1, "--soak-requests", "--soak-max-tokens")
    require_at_least(args, 0, "--token-budget")
    if args.policy != "alternate" and 0 < args.token_budget <= args.batch_size:
        fail(
            f"--token-budget must be more than --batch-size ({args.batch_size}), or "
            f"0 for no limit, got {args.token_budget}"
        )
    require_positive(args, "--soak-rate", "--soak-time-limit")
    require_fraction(args, "--soak-cancel")
    if args.skip_soak and args.soak_only:
        fail("--skip-soak and --soak-only leave nothing to run: give one of them")


def main() -> None:
    parser = option_parser(__doc__.splitlines()[0])
    add_workload_arguments(parser)
    parser.set_defaults(requests=30, rate=0.3, max_tokens=24, long_notes=8)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument(
        "--policy",
        choices=("alternate", "mixed"),
        help="ours' policy (default: what pdm run serve picks)",
    )
    parser.add_argument(
        "--token-budget",
        type=int,
        default=0,
        help="ours, mixed policy (default 0: no limit, as pdm run serve)",
    )
    parser.add_argument(
        "--kv-cache",
        choices=("paged", "dense"),
        help="ours' KV cache (default: what pdm run serve picks)",
    )
    parser.add_argument(
        "--peer-concurrency",
        type=int,
        help="mlx_lm.server's --decode-concurrency and --prompt-concurrency "
        "(default: --batch-size)",
    )
    parser.add_argument(
        "--peer-weights",
        default="folder",
        choices=("folder", "float32"),
        help="folder: the embedded folder as it is (4-bit); float32: the same "
        "weights as ours, dequantized",
    )
    parser.add_argument("--skip-soak", action="store_true")
    parser.add_argument("--soak-only", action="store_true")
    parser.add_argument("--soak-requests", type=int, default=300)
    parser.add_argument("--soak-rate", type=float, default=3.0)
    parser.add_argument("--soak-max-tokens", type=int, default=8)
    parser.add_argument("--soak-cancel", type=float, default=0.2)
    parser.add_argument("--soak-time-limit", type=float, default=900.0)
    parser.add_argument("--json", type=Path, default=Path("bench-serve.json"))
    add_solution_option(parser)
    args = parser.parse_args()
    check_solution(args)
    check_options(args)
    console = Console(width=150)
    record = {"arguments": {k: str(v) for k, v in vars(args).items()}}
    record["machine"] = (
        f"{platform.machine()} {platform.system()}, {os.cpu_count()} CPUs"
    )
    if not args.soak_only:
        requests = workload_of(args)
        runs, summaries = {}, []
        for start in (ours, peer):
            server = start(args, free_port())
            try:
                outcomes, summary = load(server, requests, args)
            finally:
                server.stop()
            runs[server.name] = outcomes
            summaries.append(summary)
        title = (
            f"{args.requests} requests at {args.rate}/s, {args.max_tokens} tokens each, "
            f"{int(100 * args.long_fraction)}% long (~{27 * args.long_notes} tokens)"
        )
        console.print(report.table(title, summaries))
        goals = goal_lines(*summaries)
        for line in goals:
            console.print(line, highlight=False)
        record.update(side_by_side=summaries, goals=goals)
        report.plot(IMAGES / "serving-load.png", runs, title)
    if not args.skip_soak:
        record["soak"] = soak(args, console)
    report.write_json(args.json, record)
    console.print(f"wrote {args.json} and {IMAGES}/serving-*.png")


if __name__ == "__main__":
    main()
