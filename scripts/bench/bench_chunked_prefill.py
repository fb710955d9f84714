"""Prefill beside decoding: our engine's schedules against mlx-lm's, on one machine.

    pdm run bench-chunked-prefill [--cases a,b,c] [--configs LIST] [--quick]
                                  [--repeats 1] [--time-limit S] [--out FILE]
                                  [--images-prefix PATH] [--timeline CASE:CONF,CONF]

Three workloads on the embedded SmolLM2 in float32, batch 5 (scripts/bench/benchlib/
workloads.py): a, long prompts queued among short ones; b, a long prompt arrives
while 4 requests decode; c, requests arriving over time (Poisson, fixed seed, one in
four long).

Configurations (--configs, comma-separated):
- alternate:CHUNK: our Engine's day 7 schedule, a chunk's forward then the decodes';
- mixed:BUDGET[/CAP]: our Engine's week 3 schedule, ONE forward a step with every
  decode and prefill chunks up to BUDGET tokens (none: no limit), CAP tokens at most
  per request and step;
- mlx-lm:CHUNK: mlx-lm's BatchGenerator with prefill_step_size CHUNK, on the same
  float32 weights.
CHUNK, BUDGET and CAP are numbers or none (whole prompts). EOS is masked out of the
greedy sampler, so every engine does the same work.

Reports, per case and configuration: TTFT and inter-token latency p50/p99, the
longest stall, throughput, peak memory; then the goals: for each mlx-lm
configuration, is one of ours at least 10% better on both the longest stall and the
total time, and is our unchunked peak memory no higher than mlx-lm's (a missed
one: exit status 1). Writes the JSON (--out), a Markdown report beside it, and PNGs
(--images-prefix + pareto.png, metrics.png, timeline.png): the timeline shows one
case's two configurations, lane per request, from the engine's ForwardRecords.

--repeats N runs N rounds, each configuration once a round, and keeps each one's
median run by total time: a busy spell of the machine slows one run of each.
"""

from scripts.commands.interrupt import exit_on_interrupt

exit_on_interrupt()  # first: Ctrl-C during the imports below never shows a traceback

import tiny_llm_base  # noqa: F401  (first: loads the fast BLAS before mlx.core)

# isort: split
import argparse
import gc
import sys
import time
from pathlib import Path

import mlx.core as mx

from scripts.bench.benchlib import plots, render
from scripts.bench.benchlib.course import course, run_benchmark
from scripts.bench.benchlib.harness import Bench, interleaved
from scripts.bench.benchlib.measure import (
    Run,
    dominance_goals,
    median_run,
    memory_goals,
)
from scripts.bench.benchlib.runners import (
    BATCH_SIZE,
    Config,
    parse_config,
    run_mlx_lm,
    run_ours,
)
from scripts.bench.benchlib.workloads import CASE_TITLES, WORKLOADS, warmup_workload
from scripts.commands.cli import fail
from scripts.commands.probes import newest_policy

DEFAULT_CONFIGS = (
    "alternate:32,alternate:128,alternate:512,alternate:none,"
    "mixed:40,mixed:64,mixed:256,mixed:512,mixed:none/128,mixed:none,"
    "mlx-lm:32,mlx-lm:128,mlx-lm:512,mlx-lm:none"
)
DEFAULT_TIMELINE = "b:alternate:128,mixed:none/128"
WEEK2_TIMELINE = "b:alternate:128,alternate:none"
QUICK_CONFIGS = (
    "alternate:128,alternate:none,mixed:40,mixed:none/128,mixed:none,"
    "mlx-lm:32,mlx-lm:128,mlx-lm:512,mlx-lm:none"
)


def parse_args(bench: Bench) -> argparse.Namespace:
    parser = bench.parser
    parser.add_argument("--cases", default="a,b,c", help="any of a, b, c")
    parser.add_argument(
        "--configs",
        help=f"default: {DEFAULT_CONFIGS}; with --quick: {QUICK_CONFIGS}",
    )
    parser.add_argument(
        "--images-prefix",
        help="PNG paths start with this (default: beside --out, named after it)",
    )
    parser.add_argument(
        "--timeline",
        help="CASE:CONFIG,CONFIG: the two runs the timeline picture shows (default: "
        f"{DEFAULT_TIMELINE}; {WEEK2_TIMELINE} for a package without week 3)",
    )
    args = bench.parse()
    package = course.package
    args.cases = [c.strip() for c in args.cases.split(",")]
    unknown = [c for c in args.cases if c not in WORKLOADS]
    if unknown:
        fail(f"--cases: unknown case {unknown[0]!r}: choose from a, b, c")
    configs = args.configs or (QUICK_CONFIGS if args.quick else DEFAULT_CONFIGS)
    try:
        args.configs = [parse_config(c) for c in configs.split(",")]
    except ValueError as error:
        fail(f"--configs: {error}")
    # Day 7's benchmark runs on a package that stops at day 7: without week 3 day 1
    # the default configurations leave out the mixed policy (newest_policy says so).
    week2_only = newest_policy(package, None) == "alternate"
    if week2_only and configs in (QUICK_CONFIGS, DEFAULT_CONFIGS):
        args.configs = [c for c in args.configs if c.policy != "mixed"]
    if args.timeline is None:
        args.timeline = WEEK2_TIMELINE if week2_only else DEFAULT_TIMELINE
    for config in args.configs:
        if config.budget is not None and config.budget <= BATCH_SIZE:
            fail(
                f"--configs: {config.label}: a mixed budget must be more than the "
                f"batch size ({BATCH_SIZE})"
            )
    args.timeline = parse_timeline(args.timeline)
    if args.time_limit is None:
        args.time_limit = 60.0 if args.quick else 240.0
    return args


def parse_timeline(text: str) -> tuple[str, list[str]]:
    """--timeline CASE:CONFIG,CONFIG as (case, configuration labels)."""
    case, colon, configs = text.partition(":")
    if not colon or case.strip() not in WORKLOADS or not configs.strip():
        fail(
            "--timeline must be CASE:CONFIG,CONFIG with CASE one of a, b, c (e.g. "
            f"b:alternate:128,mixed:none/128), got {text!r}"
        )
    try:
        return case.strip(), [parse_config(c).label for c in configs.split(",")]
    except ValueError as error:
        fail(f"--timeline: {error}")


def progress(label: str, done: Run) -> str:
    return (
        f"  {label}: {done.total_s:.1f} s, stall {done.longest_stall_s:.2f} s "
        f"(load {done.load_average[0]:.1f})"
    )


def fresh() -> None:
    gc.collect()
    mx.clear_cache()


def main() -> int:
    bench = Bench(
        __doc__,
        quick=True,
        out="bench-results/chunked_prefill.json",
        repeats=(1, "rounds over every configuration; each keeps its median run"),
        time_limit=(
            None,
            "seconds before a run aborts what is left (default 240, quick 60)",
        ),
    )
    args = parse_args(bench)
    console = bench.start()
    models = bench.models()
    model, peer, tokenizer, sampler = (
        models.float32, models.peer, models.tokenizer, models.no_eos
    )  # fmt: skip

    def run(workload, config: Config) -> Run:
        fresh()
        if config.engine == "ours":
            return run_ours(
                model, tokenizer, workload, config, sampler, args.time_limit
            )
        return run_mlx_lm(peer, workload, config, sampler, args.time_limit)

    warmup = warmup_workload(tokenizer)  # each code path the run takes, compiled once
    kinds = {(c.engine, c.policy) for c in args.configs}
    for config in map(
        parse_config, ("alternate:8", "mixed:16", "mixed:none", "mlx-lm:8")
    ):
        if (config.engine, config.policy) in kinds:
            run(warmup, config)

    cases, goals, report = {}, [], []
    for case in args.cases:
        workload = WORKLOADS[case](tokenizer, args.quick)
        title = f"case {CASE_TITLES[case]}: {workload.describe()}"
        console.print(title)
        jobs = {c.label: lambda c=c, w=workload: run(w, c) for c in args.configs}
        repeats = interleaved(jobs, args.repeats, console=console, line=progress)
        runs = [median_run(repeats[config.label]) for config in args.configs]
        console.print(render.table(title, runs))
        met = dominance_goals(case, runs) + memory_goals(case, runs)
        cases[case] = {"workload": title, "runs": runs}
        bench.keep(f"case {case}", cases[case], met)
        goals += met
        report.append(render.markdown(title, runs, met))

    out = args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text(
        f"`{' '.join(['pdm run bench-chunked-prefill', *sys.argv[1:]])}`: "
        f"{time.strftime('%Y-%m-%d %H:%M')}\n\n" + "\n".join(report)
    )
    prefix = args.images_prefix or str(out.with_suffix("")) + "-"
    Path(prefix).parent.mkdir(parents=True, exist_ok=True)
    images = [out.with_suffix(".md"), Path(prefix + "pareto.png")]
    images.append(Path(prefix + "metrics.png"))
    titles = {CASE_TITLES[c]: info["runs"] for c, info in cases.items()}
    plots.plot_pareto(titles, images[1])
    plots.plot_metrics(titles, images[2])
    timeline_case, timeline_configs = args.timeline
    runs = {r.config: r for r in cases.get(timeline_case, {}).get("runs", [])}
    if all(c in runs for c in timeline_configs):
        images.append(Path(prefix + "timeline.png"))
        short = WORKLOADS[timeline_case](tokenizer, args.quick).short
        panels = [(c, runs[c]) for c in timeline_configs]
        plots.plot_timeline(panels, short, images[-1])
    else:
        console.print(
            f"no timeline: case {timeline_case} did not run all of {timeline_configs}"
        )
    record = dict(
        quick=args.quick,
        repeats=args.repeats,
        time_limit_s=args.time_limit,
        cases=cases,
    )
    return bench.finish(record, goals, images)


if __name__ == "__main__":
    run_benchmark(main)
