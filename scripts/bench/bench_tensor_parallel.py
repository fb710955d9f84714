"""What tensor parallelism's communication costs here: `pdm run bench-tensor-parallel`.

Launches itself with mlx.launch's code (scripts/commands/calm_launch.py: its launcher
without the busy loop) with `--backend ring` on 127.0.0.1, once per rank count,
and reports from rank 0:
- bytes all-reduced per layer per token (two all_sums of one hidden vector each),
- the median latency of one ring all_sum of the sizes a forward of the embedded
  model sums (1 token: a decode step; 16 and 128: prefill chunks),
- the embedded model's decode step, unsharded (1 rank) and sharded, with the part
  of it the all_sums alone would take.

    pdm run bench-tensor-parallel                 # 1, 2 and 3 ranks
    pdm run bench-tensor-parallel --ranks 2 --repeats 50 --out tp.json
"""

from scripts.commands.interrupt import exit_on_interrupt

exit_on_interrupt()  # first: Ctrl-C during the imports below never shows a traceback

import tiny_llm_base  # noqa: F401  (first: loads the fast BLAS before mlx.core)

# isort: split
import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from statistics import median

import mlx.core as mx

from tiny_llm_base import fast_blas
from scripts.bench.benchlib.course import course, run_benchmark
from scripts.bench.benchlib.decoding import Decoder, decode_times
from scripts.bench.benchlib.harness import Bench, timed
from scripts.commands.calm_launch import launcher
from scripts.commands.ports import free_ports
from scripts.commands.cli import fail
from tiny_llm_base import load_model

TOKENS = [1, 16, 128]
PROMPT_TOKENS = 32
LAUNCH_TIMEOUT = 300


def all_sum_seconds(group, shape: tuple[int, ...], repeats: int) -> float:
    """Median seconds of one all_sum of a float32 array of `shape`, evaluated."""
    x = mx.ones(shape)
    return median(timed(lambda: mx.distributed.all_sum(x, group=group), repeats, 3))


def worker(args: argparse.Namespace) -> None:
    group = mx.distributed.init()
    fast_blas.share_cores(group.size())  # as serve's ranks do (ranks.py)
    mlx_model, _ = load_model()
    model = course.ShardedQwen2Model(mlx_model, group, "float32", use_fast_kernels=True)
    hidden = model.args.hidden_size
    prompt, steps = mx.array([[1] * PROMPT_TOKENS]), args.repeats  # batch 1
    result = {
        "ranks": group.size(),
        "hidden": hidden,
        "layers": model.num_layers,
        "all_sum_seconds": {
            str(n): all_sum_seconds(group, (1, n, hidden), args.repeats) for n in TOKENS
        }
        if group.size() > 1
        else {},
        "decode_step_seconds": median(decode_times(Decoder(model), prompt, steps)),
    }
    if group.rank() == 0:
        Path(args.json_out).write_text(json.dumps(result))


def launch(ranks: int, repeats: int, solution: str) -> dict:
    """Rank 0's figures from `ranks` local ranks; exits when a rank fails or the
    launch runs past LAUNCH_TIMEOUT (all its processes killed)."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "rank0.json"
        command = [
            sys.executable, __file__,
            "--worker", "--json-out", str(out), "--repeats", str(repeats),
            "--solution", solution,
        ]  # fmt: skip
        if ranks > 1:  # one rank runs alone: the ring needs two
            command[:1] = [
                *launcher(),
                "--hosts", "127.0.0.1", "-n", str(ranks), "--backend", "ring",
                "--starting-port", str(free_ports(ranks)),
                "--python", sys.executable,
            ]  # fmt: skip
        root = str(Path(__file__).resolve().parents[2])  # `scripts` for the ranks
        path = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
        process = subprocess.Popen(
            [str(part) for part in command],
            env={**os.environ, "PYTHONPATH": path},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            output, _ = process.communicate(timeout=LAUNCH_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            fail(f"{ranks} ranks ran past {LAUNCH_TIMEOUT} s", status=1)
        except BaseException:  # Ctrl-C: the ranks, a session of their own, go too
            os.killpg(process.pid, signal.SIGKILL)
            raise
        if not out.exists():
            fail(f"{ranks} ranks failed:\n{output[-3000:]}", status=1)
        return json.loads(out.read_text())


def report(results: list[dict]) -> str:
    first = results[0]
    hidden, layers = first["hidden"], first["layers"]
    per_layer = 2 * hidden * 4
    lines = [
        f"Embedded model: hidden {hidden}, {layers} layers, float32.",
        f"All-reduced per layer per token: 2 sums x {hidden} x 4 B = {per_layer:,} B;"
        f" per token {per_layer * layers:,} B over {layers} layers.",
        "",
        "| ranks | all_sum 1 token | 16 tokens | 128 tokens | decode step |"
        " of which all_sums (2 x layers x 1 token) |",
        "|---|---|---|---|---|---|",
    ]
    for result in results:
        sums = result["all_sum_seconds"]
        step = result["decode_step_seconds"]
        cells = [f"{sums[str(n)] * 1e6:,.0f} us" if sums else "-" for n in TOKENS]
        share = 2 * layers * sums["1"] if sums else 0.0
        lines.append(
            f"| {result['ranks']} | {' | '.join(cells)} | {step * 1e3:,.1f} ms | "
            + (f"{share * 1e3:,.1f} ms ({share / step:.0%}) |" if sums else "- |")
        )
    return "\n".join(lines)


def main() -> int:
    bench = Bench(__doc__, repeats=(20, "timed all_sums and decode steps"))
    bench.option("--ranks", "1,2,3", "rank counts, e.g. 2,3")
    bench.option("--worker", False, argparse.SUPPRESS)
    bench.option("--json-out", help=argparse.SUPPRESS)
    args = bench.parse()
    if args.worker:
        return worker(args)
    try:
        counts = [int(n) for n in args.ranks.split(",")]
    except ValueError:
        fail(f"--ranks takes counts such as 2,3, not {args.ranks!r}")
    if any(not 1 <= n <= 9 for n in counts):
        fail("--ranks: each count between 1 and 9 (the model has 9 heads)")
    console = bench.start()
    results = [launch(n, args.repeats, args.solution) for n in counts]
    console.print(report(results), markup=False)
    return bench.finish(dict(results=results))


if __name__ == "__main__":
    run_benchmark(main)
