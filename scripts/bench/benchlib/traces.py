"""A trace: short chats arriving as a Poisson process and, with_long, one long
prompt arriving later, run through a fresh Engine; each request's times, and the
latency figures a row of a table shows (the shorts' TTFT and ITL, the long request's
TTFT and finish time).

`sizes` is any object with the fields trace() reads (bench-latency's Sizes): rate,
span_s, max_shorts, short_max_tokens, long_tokens, long_max_tokens, long_at_s.
Imports MLX only through the course package.
"""

from itertools import pairwise

import numpy as np

from tiny_llm_base.mlx_lm_reference import chat_ids

from . import render
from .course import course
from .measure import percentile
from .prompt_texts import SHORT_QUESTIONS
from .runners import drive
from .workloads import Workload, long_prompt


def trace(tokenizer, sizes, with_long: bool) -> Workload:
    """Short chat questions at Poisson arrival times within span_s (seed 0), then,
    last in the list, the long prompt at long_at_s."""
    gaps = np.random.default_rng(0).exponential(1 / sizes.rate, sizes.max_shorts)
    arrivals = [float(t) for t in np.cumsum(gaps) - gaps[0] if t < sizes.span_s]
    prompts = [
        chat_ids(tokenizer, SHORT_QUESTIONS[i % 10]) for i in range(len(arrivals))
    ]
    max_tokens = [sizes.short_max_tokens] * len(prompts)
    short = [True] * len(prompts)
    if with_long:
        prompts.append(long_prompt(tokenizer, sizes.long_tokens, seed=7))
        max_tokens.append(sizes.long_max_tokens)
        arrivals.append(sizes.long_at_s)
        short.append(False)
    n = len(prompts)
    return Workload("trace", prompts, max_tokens, [0] * n, short, arrival_s=arrivals)


def describe(workload: Workload, sizes) -> str:
    long = len(workload.prompts[-1])
    return (
        f"{sum(workload.short)} short requests ({sizes.rate:g}/s within "
        f"{sizes.span_s:g} s, {sizes.short_max_tokens} tokens each), a {long:,}-token "
        f"prompt at {sizes.long_at_s:g} s ({sizes.long_max_tokens} tokens)"
    )


def run_trace(model, tokenizer, sampler, settings, workload, time_limit_s) -> dict:
    """A fresh Engine through the trace (drive: each request interactive, handed
    over when due). Per request, its times in seconds from the start (arrival: when
    it was due; prefill_start: its first chunk; tokens: each token's); per forward
    (steps), its start and seconds, its chunks (request index, tokens) and its
    decode rows (request indices): what a slow first token waited on; and the
    counts."""
    forwards = []
    engine = course.Engine(
        model,
        tokenizer,
        **{"max_seq_len": model.context_length, **settings},
        sampler=sampler,
        on_forward=forwards.append,
    )
    run = drive(engine, workload, time_limit_s, priority="interactive")
    total = run.end - run.start

    def since(t: float | None) -> float | None:
        return None if t is None else t - run.start

    index = run.index_of
    steps = [
        dict(
            start=since(f.start),
            seconds=f.end - f.start,
            chunks=[(index[i], n) for i, n in f.chunks],
            decodes=[index[i] for i in f.decodes],
        )
        for f in forwards
    ]

    requests = [
        dict(
            short=short,
            arrival=since(arrival),
            prefill_start=since(result and result.metrics.prefill_start),
            tokens=[since(t) for t in result.metrics.token_times] if result else [],
        )
        for arrival, result, short in zip(run.arrivals, run.results, workload.short)
    ]
    return dict(
        requests=requests,
        forwards=steps,
        max_tokens=workload.max_tokens,
        steps=engine.steps_done,
        busy=sum(f["seconds"] for f in steps) / total,
        preemptions=engine.metrics.preemptions,
        total_s=total,
    )


def latency(outcome: dict) -> dict:
    """A row's numbers: the shorts' TTFT p50/p99 and ITL p99 (each gap between two
    tokens of one request), the long request's TTFT and finish time (arrival -> last
    token; None unless it finished), and the run's counts."""
    done = [
        r
        for r, m in zip(outcome["requests"], outcome["max_tokens"])
        if len(r["tokens"]) == m
    ]
    shorts = [r for r in done if r["short"]]
    ttft = [r["tokens"][0] - r["arrival"] for r in shorts]
    gaps = [b - a for r in shorts for a, b in pairwise(r["tokens"])]
    long = next((r for r in done if not r["short"]), None)
    return dict(
        shorts=sum(r["short"] for r in outcome["requests"]),
        short_ttft_p50_s=percentile(ttft, 50),
        short_ttft_p99_s=percentile(ttft, 99),
        short_itl_p99_s=percentile(gaps, 99),
        long_ttft_s=None if long is None else long["tokens"][0] - long["arrival"],
        long_finish_s=None if long is None else long["tokens"][-1] - long["arrival"],
        unfinished=len(outcome["requests"]) - len(done),
        **{k: outcome[k] for k in ("steps", "busy", "preemptions", "total_s")},
    )


def slowest_wait(outcome: dict) -> str:
    """What the short request with the longest TTFT waited on: each forward between
    its arrival and its first token, its seconds, the long prompt's chunk (L) and
    the shorts' chunks (S) in it, and its decode rows (the long one's marked)."""
    requests = outcome["requests"]
    shorts = [(i, r) for i, r in enumerate(requests) if r["short"] and r["tokens"]]
    if not shorts:
        return "-"
    i, slow = max(shorts, key=lambda p: p[1]["tokens"][0] - p[1]["arrival"])
    arrival, first = slow["arrival"], slow["tokens"][0]
    waited = [
        f
        for f in outcome["forwards"]
        if f["start"] + f["seconds"] > arrival and f["start"] <= first
    ]

    def one(f: dict) -> str:
        parts = [
            ("S" if requests[j]["short"] else "L") + str(n) for j, n in f["chunks"]
        ]
        rows = len(f["decodes"])
        if any(not requests[j]["short"] for j in f["decodes"]):
            rows = f"{rows} (L among them)"
        return f"{f['seconds']:.2f} s [{' '.join(parts) or 'no chunk'}, rows {rows}]"

    shown = [one(f) for f in waited]
    if len(waited) > 4:  # queued: the first forward, the count, the last two
        skipped = sum(f["seconds"] for f in waited[1:-2])
        shown[1:-2] = [f"{len(waited) - 3} more, {skipped:.1f} s"]
    head = f"short #{i} at {arrival:.1f} s, TTFT {first - arrival:.2f} s: "
    return head + "; ".join(shown)


def ms(value: float | None) -> str:
    return "-" if value is None or np.isnan(value) else f"{1000 * value:,.0f}"


def s1(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


COLUMNS = {  # header -> the cell, from a row's numbers (latency); TTFT, ITL: shorts
    "shorts": lambda n: str(n["shorts"]),
    "TTFT p50 ms": lambda n: ms(n["short_ttft_p50_s"]),
    "TTFT p99 ms": lambda n: ms(n["short_ttft_p99_s"]),
    "ITL p99 ms": lambda n: ms(n["short_itl_p99_s"]),
    "long TTFT s": lambda n: s1(n["long_ttft_s"]),
    "long finish s": lambda n: s1(n["long_finish_s"]),
    "steps": lambda n: str(n["steps"]),
    "busy": lambda n: f"{100 * n['busy']:.0f}%",
    "preempted": lambda n: str(n["preemptions"]),
    "total s": lambda n: (
        s1(n["total_s"]) + (f" ({n['unfinished']} cut)" if n["unfinished"] else "")
    ),
}


def trace_table(title: str, rows: dict[str, dict], first: str = "setting"):
    cells = [
        [label, *(cell(n) for cell in COLUMNS.values())] for label, n in rows.items()
    ]
    return render.grid(title, [first, *COLUMNS], cells)


def lane_title(label: str, outcome: dict) -> str:
    n = latency(outcome)
    long = f", long finish {s1(n['long_finish_s'])} s" if n["long_finish_s"] else ""
    return f"{label}: short TTFT p99 {ms(n['short_ttft_p99_s'])} ms{long}"
