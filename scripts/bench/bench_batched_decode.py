"""What one batched decode step costs as rows are added (week 2 day 5).

    pdm run bench-batched-decode [--repeats 15] [--context 40] [--out FILE]

The embedded model in float32 on the fast path (`Qwen2ModelWeek2`, the package
--solution picks), one `BatchingKvCache` per layer with 10 slots: each row is a
--context-token prompt prefilled once in a cache of its own; before each timed step
(untimed) the first `rows` of them are copied into a fresh batch cache, then one
decode step feeds a token to each, for rows 1, 2, 5 and 10. Each step is timed after a warm-up, rows
interleaved round by round (a busy spell slows one run of each), the median kept.
The step cost grows with the rows' attention and output layer, not with the
weights, which are read once a step: goal, 10 rows at most 4x one row's step
(batching makes at least 2.5x the tokens a second). Beside each, its model bandwidth
utilization (benchlib/roofline.py): the float32 weights and the rows' keys and
values at --context + 1 positions, read once a step, over the read bandwidth
measured in the same run (one thread's or every core's, the larger).
"""

from scripts.commands.interrupt import exit_on_interrupt

exit_on_interrupt()  # first: Ctrl-C during the imports below never shows a traceback

import tiny_llm_base  # noqa: F401  (first: loads the fast BLAS before mlx.core)

# isort: split
import time

import mlx.core as mx

from scripts.bench.benchlib.course import course, run_benchmark
from scripts.bench.benchlib.goals import at_most
from scripts.bench.benchlib.harness import Bench, interleaved, medians
from scripts.bench.benchlib.roofline import bytes_per_step, mbu, measure_bandwidth

ROWS = (1, 2, 5, 10)
SLOTS = max(ROWS)


def prefilled_rows(model, context: int) -> list[list]:
    """Each slot's own prefilled caches (one per layer): a different
    `context`-token prompt a slot."""
    rows = []
    for slot in range(SLOTS):
        prompt = [(7 + 13 * slot + 31 * i) % 1000 + 100 for i in range(context)]
        own = model.create_kv_cache()
        mx.eval(model(mx.array([prompt]), 0, own))
        rows.append(own)
    return rows


def step_seconds(model, prefilled: list[list], rows: int, context: int) -> float:
    """One decode step over the first `rows` slots of a batch cache filled from
    `prefilled` (untimed), the rest empty: its seconds."""
    cache = [course.BatchingKvCache(SLOTS, 2 * context) for _ in prefilled[0]]
    for slot in range(rows):
        for layer, own in zip(cache, prefilled[slot]):
            layer.add_request(own, slot)
    inputs = mx.array([[11 + slot] for slot in range(rows)])
    start = time.perf_counter()
    mx.eval(model(inputs, [context] * rows, cache))
    return time.perf_counter() - start


def main() -> int:
    bench = Bench(
        __doc__, repeats=(15, "timed steps at each row count, the median kept")
    )
    bench.option("--context", 40, "cached tokens per row before the step", least=1)
    args = bench.parse()
    console = bench.start()
    models = bench.models()
    model = models.float32
    with console.status("prefilling the rows"):
        prefilled = prefilled_rows(model, args.context)
        for rows in ROWS:  # warm-up: every shape once
            step_seconds(model, prefilled, rows, args.context)
    jobs = {
        rows: (lambda rows=rows: step_seconds(model, prefilled, rows, args.context))
        for rows in ROWS
    }
    ms = {
        rows: 1e3 * seconds
        for rows, seconds in medians(
            interleaved(jobs, args.repeats, console=console)
        ).items()
    }
    with console.status("measuring memory bandwidth"):
        bandwidth = measure_bandwidth()
    console.print(bandwidth.line())
    step_bytes = {r: bytes_per_step(models.peer, args.context + 1, r) for r in ROWS}
    used = {r: mbu(step_bytes[r], 1e3 / ms[r], bandwidth.best) for r in ROWS}
    bench.table(
        f"one decode step, {args.context} cached tokens a row (median of {args.repeats})",
        ["rows", "time per step", "tokens per second", "x one row's step", "MBU"],
        [
            [
                str(rows),
                f"{ms[rows]:.0f} ms",
                f"{1e3 * rows / ms[rows]:.1f}",
                f"{ms[rows] / ms[1]:.2f}",
                f"{used[rows]:.2f}",
            ]  # fmt: skip
            for rows in ROWS
        ],
    )
    ratio = ms[SLOTS] / ms[1]
    goal = at_most(
        f"{SLOTS} rows' step / one row's", ratio, 4.0,
        f"{ms[SLOTS]:.0f} ms against {ms[1]:.0f} ms",
    )  # fmt: skip
    record = {
        "context": args.context,
        "ms": {str(r): v for r, v in ms.items()},
        "bandwidth": bandwidth.record(),
        "bytes_per_step": {str(r): v for r, v in step_bytes.items()},
        "mbu": {str(r): v for r, v in used.items()},
    }
    return bench.finish(record, [goal])


if __name__ == "__main__":
    run_benchmark(main)
