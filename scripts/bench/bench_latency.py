"""Latency under load on our Engine: `pdm run bench-latency`.

pdm run bench-latency                  # both parts, the goals met or missed
pdm run bench-latency --quick          # smaller: a ~1,500-token long prompt
pdm run bench-latency --sweep          # also SWEEP's grid, one row per point
pdm run bench-latency --set long_prefill_token_threshold=32 --set fcfs:prefill_step=64

Every run is a fresh in-process Engine on the embedded model (the served weights),
greedy with EOS masked out: every request generates max_tokens.

Part 1, trace: short interactive chats arrive as a Poisson process and one long
interactive prompt arrives 3 s in, the same trace under each row of SETTINGS. Goals:
the shorts' TTFT p99 under "defaults" at most 2x under "stream alone" (no long
prompt); the long request's finish time (arrival -> last token) under "defaults" at
most 1.2x under "first come, first served" (one prompt prefills at a time).
Part 2, priority: 4 batch requests hold every slot; an interactive request arrives.
Goals: its TTFT at most 1.2x on an idle engine; the batch tokens unchanged.

--set KEY=VALUE (repeatable) changes an engine setting of "defaults", which the sweep
and part 2 start from; --set NAME:KEY=VALUE one of row NAME. Writes the tables, what
the slowest short request of each row waited on (the forwards between its arrival
and its first token), JSON (--out, default bench-results/latency[-quick].json, with
every forward: start, seconds, chunks, decode rows) and the trace's timeline
(week3-latency-timeline.png beside the JSON; into book/src/images with
--book-figures).
"""

from scripts.commands.interrupt import exit_on_interrupt

exit_on_interrupt()  # first: Ctrl-C during the imports below never shows a traceback

import tiny_llm_base  # noqa: F401  (first: the fast BLAS before mlx.core)

# isort: split
import dataclasses
import functools
import itertools
import statistics

import mlx.core as mx

from scripts.bench.benchlib import plots
from scripts.bench.benchlib.course import course, run_benchmark
from scripts.bench.benchlib.harness import Bench
from scripts.bench.benchlib.goals import Goal, at_most, identical
from scripts.bench.benchlib.prompt_texts import SHORT_QUESTIONS
from scripts.bench.benchlib.runners import all_decoding, run_to_end
from scripts.bench.benchlib.settings import check_rows, parse_sets
from scripts.bench.benchlib.traces import (
    describe,
    lane_title,
    latency,
    ms,
    run_trace,
    s1,
    slowest_wait,
    trace,
    trace_table,
)
from scripts.bench.benchlib.workloads import long_prompt, warmup_workload
from scripts.commands.engine_options import MIXED_STEP_DEFAULTS
from scripts.commands.probes import newest_kv_cache
from tiny_llm_base import PromptSpec
from tiny_llm_base.mlx_lm_reference import chat_ids


# What serve runs with unless told otherwise: 8 slots (one kept for interactive
# requests), 128-token chunks, the paged cache (dense, said on stderr, on a package
# without week 3 day 2), the model's whole context per request
# (run_trace), one mixed forward a step with the CLI's partial-prefill limits; the
# rest (batch_patience) at its EngineConfig default.
DEFAULTS = dict(
    batch_size=8,
    reserved_interactive_slots=1,
    prefill_step=128,
    kv_cache="paged",
    policy="mixed",
    **MIXED_STEP_DEFAULTS,
)
NO_LIMITS = {name: None for name in MIXED_STEP_DEFAULTS}
# name -> (label, settings over DEFAULTS, whether the trace has the long prompt).
# First come, first served prefills one prompt at a time in whole prefill_step
# chunks (no long-prompt cap): the long request's fastest way through.
SETTINGS = {
    "stream": ("stream alone", {}, False),
    "fcfs": (
        "first come, first served",
        {**NO_LIMITS, "max_num_partial_prefills": 1},
        True,
    ),
    "alternate": ("alternate", {**NO_LIMITS, "policy": "alternate"}, True),
    "defaults": ("defaults", {}, True),
}
# --sweep: every combination, each over "defaults" (12 runs, ~15 minutes here).
SWEEP = {
    "long_prefill_token_threshold": (None, 32, 64, 128),
    "max_num_partial_prefills": (None, 2, 4),
}
SHORT_NAMES = {
    "long_prefill_token_threshold": "long",
    "max_num_partial_prefills": "partial",
}


@dataclasses.dataclass(frozen=True)
class Sizes:
    """The trace's and the priority part's sizes.

    rate: short requests a second. Measured here (2 CPU cores, the stream alone for
    30 s), the engine's forwards took 59% of the time at 0.5/s, 88% at 1/s, 97% at
    1.5/s and all of it at 2/s. 1/s keeps the machine busy without overloading it:
    the stream alone still gets its first token in a step or two (TTFT p50 0.5 s,
    p99 0.8 s), so what a long prompt adds is not lost in a queue of its own.
    """

    long_tokens: int
    span_s: float  # short requests arrive during the first span_s seconds
    rate: float = 1.0
    short_max_tokens: int = 16
    long_max_tokens: int = 16
    long_at_s: float = 3.0
    max_shorts: int = 200
    batch_max_tokens: int = 128
    repeats: int = 3
    time_limit_s: float = 300.0  # a trace run aborts what is left after this


# The full trace at 0.25 chats a second: at 1/s the chats alone keep this CPU 82%
# busy, and with a 6,000-token prompt (about a minute of prefill) the work passes
# what the machine can do in the window: every schedule then queues, whatever it
# does. At 0.25/s there is room for the long prompt beside the chats.
FULL = Sizes(long_tokens=6000, span_s=90.0, rate=0.25)
QUICK = Sizes(long_tokens=1500, span_s=15.0, batch_max_tokens=32, time_limit_s=90)


def sweep_points() -> list[tuple[str, dict]]:
    """SWEEP's combinations, each (label, settings)."""
    points = [dict(zip(SWEEP, values)) for values in itertools.product(*SWEEP.values())]
    return [
        (" ".join(f"{SHORT_NAMES.get(k, k)}={v}" for k, v in p.items()), p)
        for p in points
    ]


# --- options ------------------------------------------------------------------------


def parse_args(bench: Bench):
    bench.option("--sweep", False, "also run SWEEP's grid")
    help = "an engine setting of 'defaults' (or of row NAME); repeatable"
    bench.option("--set", [], help, action="append", metavar="[NAME:]KEY=VALUE")
    help = "short requests a second (full 0.25, quick 1)"
    bench.option("--rate", None, help, type=float, positive=True)
    args = bench.parse()
    args.sizes = QUICK if args.quick else FULL
    if args.rate is not None:
        args.sizes = dataclasses.replace(args.sizes, rate=args.rate)
    overrides = parse_sets(args.set, SETTINGS, "defaults")
    kv_cache, prefix_caching = newest_kv_cache(course.package, None)
    defaults = {**DEFAULTS, "kv_cache": kv_cache, "prefix_caching": prefix_caching}
    args.settings = {
        name: {**defaults, **changes, **overrides[name]}
        for name, (_, changes, _) in SETTINGS.items()
    }
    points = sweep_points() if args.sweep else []
    checked = [*args.settings.items()]
    checked += [(label, {**args.settings["defaults"], **p}) for label, p in points]
    check_rows(checked)
    return args


# --- part 2: priority ---------------------------------------------------------------


def priority_part(model, tokenizer, sampler, settings: dict, sizes: Sizes) -> dict:
    """TTFT of an interactive request that arrives while 4 batch requests hold every
    slot, against the same request on an idle engine (the median of `repeats` each,
    a fresh engine every time); the batch requests' tokens against a run without
    it."""
    settings = {"max_seq_len": 1024, **settings}
    settings.update(batch_size=4, reserved_interactive_slots=0)
    batch = [
        PromptSpec(
            chat_ids(tokenizer, q), max_tokens=sizes.batch_max_tokens, priority="batch"
        )
        for q in SHORT_QUESTIONS[:4]
    ]
    prompt = long_prompt(tokenizer, 100, seed=11)
    interactive = PromptSpec(prompt, max_tokens=8, priority="interactive")

    def run(specs: list[PromptSpec], then: PromptSpec | None = None):
        """specs to the end; `then` added once all of them decode. The results in
        the order added, and the engine's preemptions."""
        engine = course.Engine(model, tokenizer, sampler=sampler, **settings)
        if then:
            all_decoding(engine, specs)
        return run_to_end(engine, [then] if then else specs), engine.metrics.preemptions

    idle = [
        run([interactive])[0][0].metrics.time_to_first_token
        for _ in range(sizes.repeats)
    ]
    alone = [r.tokens for r in run(batch)[0]]
    busy = [run(batch, interactive) for _ in range(sizes.repeats)]
    busy_ttft = [results[-1].metrics.time_to_first_token for results, _ in busy]
    return dict(
        batch_requests=len(batch),
        batch_max_tokens=sizes.batch_max_tokens,
        interactive_prompt_tokens=len(prompt),
        idle_ttft_s=statistics.median(idle),
        busy_ttft_s=statistics.median(busy_ttft),
        busy_ttfts_s=busy_ttft,
        ratio=statistics.median(busy_ttft) / statistics.median(idle),
        batch_runs=len(busy),
        unchanged=sum([r.tokens for r in res[:-1]] == alone for res, _ in busy),
        preemptions=[p for _, p in busy],
    )


# --- report -------------------------------------------------------------------------


def goals_of(rows: dict[str, dict], priority: dict) -> list[Goal]:
    """Each ratio at most its bound, with the two figures behind it; the batch
    requests' tokens unchanged."""

    def ratio(key: str, a: str, b: str) -> float | None:
        x, y = rows[a][key], rows[b][key]
        return None if x is None or y is None else x / y

    def both(key: str, a: str, b: str) -> str:
        def one(n: str) -> str:  # a long request the time limit cut has no figure
            value = rows[n][key]
            return f"{SETTINGS[n][0]} " + ("cut" if value is None else f"{s1(value)} s")

        return f"{one(a)} vs {one(b)}"

    p = priority
    busy = (
        f"{ms(p['busy_ttft_s'])} ms beside the batch vs {ms(p['idle_ttft_s'])} ms idle"
    )
    return [
        at_most(
            "short TTFT p99, defaults / stream alone",
            ratio("short_ttft_p99_s", "defaults", "stream"),
            2.0,
            both("short_ttft_p99_s", "defaults", "stream"),
        ),
        at_most(
            "long request's finish, defaults / first come, first served",
            ratio("long_finish_s", "defaults", "fcfs"),
            1.2,
            both("long_finish_s", "defaults", "fcfs"),
        ),
        at_most(
            "interactive TTFT beside full batch slots / idle", p["ratio"], 1.2, busy
        ),
        identical("batch tokens unchanged", p["unchanged"], p["batch_runs"]),
    ]


def main() -> int:
    bench = Bench(__doc__, quick=True, out="bench-results/latency.json")
    args = parse_args(bench)
    sizes = args.sizes
    console = bench.start()
    models = bench.models()
    model, tokenizer, sampler = models.served, models.tokenizer, models.no_eos
    workloads = {flag: trace(tokenizer, sizes, flag) for flag in (False, True)}
    console.print(f"trace: {describe(workloads[True], sizes)}")

    trace_run = functools.partial(run_trace, model, tokenizer, sampler)

    def run(label: str, settings: dict, with_long: bool = True) -> dict:
        mx.clear_cache()
        with console.status(label):
            workload = workloads[with_long]
            outcome = trace_run(settings, workload, sizes.time_limit_s)
        console.print(f"  {label}: {outcome['total_s']:.1f} s")
        return outcome

    warmup = warmup_workload(tokenizer)
    for name in ("defaults", "alternate"):  # every code path compiled once
        trace_run(args.settings[name], warmup, 60)
    outcomes = {
        name: run(label, args.settings[name], with_long)
        for name, (label, _, with_long) in SETTINGS.items()
    }
    rows = {name: latency(outcome) for name, outcome in outcomes.items()}
    labelled = {SETTINGS[name][0]: row for name, row in rows.items()}
    title = "trace: short chats (their TTFT and ITL) and one long prompt"
    console.print(trace_table(title, labelled))
    console.print("the slowest short request's wait, the forwards it spanned:")
    for name, outcome in outcomes.items():
        console.print(f"  {SETTINGS[name][0]}: {slowest_wait(outcome)}", markup=False)
    sweep = {}
    for label, point in sweep_points() if args.sweep else []:
        sweep[label] = latency(run(label, {**args.settings["defaults"], **point}))
    if sweep:
        names = ", ".join(f"{v}: {k}" for k, v in SHORT_NAMES.items())
        console.print(trace_table(f"sweep: defaults with ({names})", sweep, "with"))
    with console.status("priority"):
        priority = priority_part(
            model, tokenizer, sampler, args.settings["defaults"], sizes
        )
    p = priority
    console.print(
        f"priority: {p['batch_requests']} batch requests of {p['batch_max_tokens']} "
        f"tokens fill batch_size 4, then an interactive request of "
        f"{p['interactive_prompt_tokens']} prompt tokens arrives: TTFT "
        f"{ms(p['busy_ttft_s'])} ms (runs: {', '.join(map(ms, p['busy_ttfts_s']))}; "
        f"preemptions: {', '.join(map(str, p['preemptions']))}), idle "
        f"{ms(p['idle_ttft_s'])} ms"
    )
    image = bench.image("week3-latency-timeline.png")
    panels = {lane_title(SETTINGS[n][0], o): o["requests"] for n, o in outcomes.items()}
    plots.plot_request_lanes(panels, image)
    record = dict(
        sizes=dataclasses.asdict(sizes),
        trace=describe(workloads[True], sizes),
        settings={SETTINGS[n][0]: s for n, s in args.settings.items()},
        rows=labelled,
        requests={SETTINGS[n][0]: o["requests"] for n, o in outcomes.items()},
        forwards={SETTINGS[n][0]: o["forwards"] for n, o in outcomes.items()},
        sweep=sweep,
        priority=priority,
    )
    return bench.finish(record, goals_of(rows, priority), [image])


if __name__ == "__main__":
    run_benchmark(main)
