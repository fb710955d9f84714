"""Every speed goal of the engine in one run, met or missed, against mlx-lm where it
has a peer: `pdm run bench-speed [--quick] [--solution learner]`.

The benchmarks run one after another, each in a process of its own and with its own
tables: bench-engine (the engine against mlx-lm's stream_generate and
BatchGenerator; a paged decode step with one long row beside short ones),
bench-paged --parts chat kv (the 10-turn chat against mlx-lm's prompt cache; the
KV dtypes against float32), bench-latency (short chats beside a long prompt).
Then every goal in one table. Their records go beside --out
(bench-results/speed-engine.json, ...). Exits 1 when a goal was missed or a
benchmark failed. A full run takes about an hour on a busy 2-core machine.
"""

from scripts.commands.interrupt import exit_on_interrupt

exit_on_interrupt()  # first: Ctrl-C during the imports below never shows a traceback

import tiny_llm_base  # noqa: F401  (first: the fast BLAS before mlx.core)

# isort: split
from scripts.bench.benchlib.course import run_benchmark
from scripts.bench.benchlib.harness import Bench
from scripts.bench.benchlib.goals import Goal
from scripts.bench.benchlib.speed_goals import PARTS, run_each


def main() -> int:
    bench = Bench(__doc__, quick=True, out="bench-results/speed.json")
    args = bench.parse()
    console = bench.start()
    folder = args.out.parent
    goals, failed = run_each(
        console, PARTS, folder, args.quick, args.solution, bench.keep
    )
    cells = [
        [part, g.name, "met" if g.met else "MISSED"]
        + ["-" if g.value is None else f"{g.value:.2f}"]
        + [f"{'at most' if g.at_most else 'at least'} {g.bound:g}"]
        for part, g in goals
    ]
    bench.table("every goal", ["benchmark", "goal", "", "value", "bound"], cells)
    unknown = [Goal(f"{part}: its goals", None, 1, "it failed") for part in failed]
    return bench.finish(
        dict(parts=list(PARTS), failed=failed), [g for _, g in goals] + unknown
    )


if __name__ == "__main__":
    run_benchmark(main)
