"""Speculative decoding measured: `pdm run bench-speculative` (week 3 day 4).

pdm run bench-speculative             # the goals, met or missed
pdm run bench-speculative --quick     # 4 requests of 32 tokens, batch 2

Two workloads, greedy, EOS ending each request as usual: input-grounded requests
(quote, summarise, edit code, answer from a given passage) and open-ended chat
(short questions, nothing to copy). Each runs on our Engine (the mixed policy, the
defaults otherwise, the embedded model in float32) without and with
speculative="ngram", at batch 1 and with 8 requests through batch_size 4 (their
prefill chunks and decodes share mixed steps); and on mlx-lm's own generation
(generate_step on the same float32 weights), one request at a time. Each
configuration runs --repeats times (2; --quick: 1), without and with speculation in
turn, and the fastest run is kept: the machine is shared.

Decode tokens/s = the tokens after each request's first / the time some request
was decoding. "In steps" counts the same speed-up in each run's own plain decode
steps (speedup_in_steps), which a load that changes between runs cannot move. Goals: input-grounded at least 1.6x without speculation at batch 1 and
1.3x at batch 4; open-ended chat at least 0.97x; the greedy tokens identical. Also
the cost of feeding k tokens in one forward against 1, at ~400 tokens of context
(the chapter's table behind DRAFT_TOKEN_COST). Writes the table, the JSON (--out)
and the accepted length per step (week3-speculative-accepted.png
beside the JSON; into book/src/images with --book-figures).
"""

from scripts.commands.interrupt import exit_on_interrupt

exit_on_interrupt()  # first: Ctrl-C during the imports below never shows a traceback

import tiny_llm_base  # noqa: F401  (first: the fast BLAS before mlx.core)

# isort: split
import statistics
import time

import mlx.core as mx

from scripts.bench.benchlib import plots, render
from scripts.bench.benchlib.course import course, run_benchmark
from scripts.bench.benchlib.harness import Bench
from scripts.bench.benchlib.goals import at_least, identical
from scripts.bench.benchlib.harness import interleaved, medians
from scripts.bench.benchlib.measure import Run, decode_tps
from scripts.bench.benchlib.runners import Config, run_mlx_lm_alone, run_ours
from scripts.bench.benchlib.workloads import (
    chat_workload,
    grounded_workload,
    long_prompt,
    warmup_workload,
)
from scripts.commands.cli import fail
from tiny_llm_base import EngineConfig, greedy

# quick?: requests per workload, max_tokens, the batch size of the shared runs
SIZES = {False: (8, 128, 4), True: (4, 32, 2)}
FEED = (1, 2, 4, 5, 8)  # tokens fed in one forward; 5 = a decode token + 4 drafts
CONTEXT = 400
K = EngineConfig().num_speculative_tokens  # the drafts a request may feed
GOALS = (  # workload, batch key, least ratio with / without speculation
    ("input-grounded", "1", 1.6),
    ("input-grounded", "B", 1.3),
    ("open-ended chat", "1", 0.97),
    ("open-ended chat", "B", 0.97),
)
NOT_RUN = (
    "mlx-lm's speculative path (stream_generate with draft_model) not run: it needs "
    "a second, smaller model sharing the tokenizer, and only the embedded model is "
    "installed; the model as its own draft would cost a full forward per guess."
)


def feed_cost(model, tokenizer, repeats: int, time_limit_s: float) -> dict:
    """Seconds of one forward feeding k tokens after CONTEXT tokens, the median of
    `repeats` runs (the k in turn, so drift hits each alike), and its ratio to k=1."""
    context = long_prompt(tokenizer, CONTEXT, seed=3)[:CONTEXT]
    cache = model.create_kv_cache()
    mx.eval(model(mx.array([context]), 0, cache))
    fed = context[-max(FEED) :]

    def feed(k: int) -> float:
        for layer in cache:  # forget the tokens fed last time
            layer.offset = CONTEXT
        start = time.perf_counter()
        mx.eval(model(mx.array([fed[:k]]), CONTEXT, cache))
        return time.perf_counter() - start

    jobs = {k: lambda k=k: feed(k) for k in FEED}
    times = interleaved(jobs, repeats, time_limit_s / len(FEED))
    median = medians(times)
    return {
        k: dict(ms=1e3 * median[k], ratio=median[k] / median[1], runs=len(times[k]))
        for k in FEED
    }


def draft_counts(run: Run) -> dict:
    """From the run's ForwardRecords: verifications, drafts fed and accepted, the
    mean accepted length (1 + accepted per verification) and the acceptance rate;
    mean forward ms of steps that verified drafts, and of plain decode steps."""
    drafts = [d for f in run.forwards for d in f.get("drafts", [])]
    fed = sum(d[1] for d in drafts)
    kept = sum(d[2] for d in drafts)

    def mean_ms(forwards: list[dict]) -> float:
        seconds = [f["end"] - f["start"] for f in forwards]
        return 1e3 * statistics.mean(seconds) if seconds else float("nan")

    alone = [f for f in run.forwards if f["decodes"] and not f["chunks"]]
    return dict(
        verifications=len(drafts),
        draft_tokens=fed,
        accepted=kept,
        mean_accepted_length=1 + kept / len(drafts) if drafts else 0.0,
        acceptance_rate=kept / fed if fed else 0.0,
        drafting_steps=sum(bool(f.get("drafts")) for f in alone),
        decode_steps=len(alone),
        verify_ms=mean_ms([f for f in alone if f.get("drafts")]),
        plain_ms=mean_ms([f for f in alone if not f.get("drafts")]),
    )


def fastest_ours(
    model, tokenizer, workload, batch: int, repeats: int, limit_s: float, ways: dict
) -> dict[str, Run]:
    """Ours under each way (its name -> a function making that run's Engine
    settings, called once a run) at batch 1 and `batch`, keys "1 <way>" and "B
    <way>": each `repeats` times, the ways in turn so that a busy spell of the
    machine hits all alike, the fastest kept. A run's config is "ours b<size>
    <way>"; the settings it ran with stay in run.settings."""
    mixed = Config("ours", "mixed", 128)  # the Engine's default prefill_step

    def ours(size: int, way: str) -> Run:
        mx.clear_cache()
        settings = ways[way]()
        run = run_ours(
            model, tokenizer, workload, mixed, greedy, limit_s, size, **settings
        )
        run.config, run.settings = f"ours b{size} {way}", settings
        return run

    runs = {}
    for size, key in ((1, "1"), (batch, "B")):
        jobs = {f"{key} {way}": lambda w=way, b=size: ours(b, w) for way in ways}
        runs |= interleaved(jobs, repeats)
    return {name: max(tries, key=decode_tps) for name, tries in runs.items()}


def run_workload(model, peer, tokenizer, workload, batch: int, repeats: int, limit_s):
    """Ours without and with ngram (fastest_ours), then mlx-lm alone (as many
    times, the fastest kept)."""
    ways = {"off": dict, "ngram": lambda: dict(speculative="ngram")}
    runs = fastest_ours(model, tokenizer, workload, batch, repeats, limit_s, ways)

    def mlx_lm() -> Run:
        mx.clear_cache()
        eos = tokenizer.eos_token_ids
        return run_mlx_lm_alone(peer, eos, workload, "mlx-lm b1", limit_s)

    tries = interleaved({"mlx-lm": mlx_lm}, repeats)["mlx-lm"]
    return runs | {"mlx-lm": max(tries, key=decode_tps)}


def rows_of(runs: dict[str, Run]) -> dict[str, dict]:
    """Each run's numbers, with its speed-up over the same batch without drafts and
    whether its tokens equal that run's (and mlx-lm's, at batch 1)."""
    rows = {}
    for key, run in runs.items():
        base = runs[key.split()[0] + " off"] if key != "mlx-lm" else runs["1 off"]
        rows[key] = dict(
            config=run.config,
            requests=len(run.tokens),
            generated=run.generated_tokens,
            total_s=run.total_s,
            decode_tps=decode_tps(run),
            speedup=decode_tps(run) / decode_tps(base),
            same_tokens=sum(a == b for a, b in zip(run.tokens, base.tokens)),
            same_as_mlx_lm=sum(
                a == b for a, b in zip(run.tokens, runs["mlx-lm"].tokens)
            ),
            **draft_counts(run),
        )
    for key, row in rows.items():
        if key.endswith("ngram"):
            row["speedup_in_steps"] = speedup_in_steps(row, rows[key[:-5] + "off"])
    return rows


def speedup_in_steps(ngram: dict, off: dict) -> float:
    """The speed-up counted in each run's own plain decode steps: the off run's
    decode-only steps against the drafting run's plain steps plus its verifying
    steps, each weighed by verify_ms / plain_ms measured in that same run. Load that
    changes between the two runs cancels out; load within a run does not."""
    plain = ngram["decode_steps"] - ngram["drafting_steps"]
    if not plain or not ngram["drafting_steps"]:
        return off["decode_steps"] / max(ngram["decode_steps"], 1)
    weight = ngram["verify_ms"] / ngram["plain_ms"]
    return off["decode_steps"] / (plain + ngram["drafting_steps"] * weight)


def table(title: str, rows: dict[str, dict]):
    columns = [
        "run", "tokens", "total s", "decode tok/s", "vs off", "in steps",
        "accepted len", "acceptance", "drafting steps", "verify / plain ms",
        "same tokens", "same as mlx-lm",
    ]  # fmt: skip
    cells = []
    for key, r in rows.items():
        drafted = r["verifications"] > 0
        cells.append([
            r["config"],
            str(r["generated"]),
            f"{r['total_s']:.1f}",
            f"{r['decode_tps']:.1f}",
            f"{r['speedup']:.2f}x",
            f"{r['speedup_in_steps']:.2f}x" if "speedup_in_steps" in r else "-",
            f"{r['mean_accepted_length']:.2f}" if drafted else "-",
            f"{100 * r['acceptance_rate']:.0f}%" if drafted else "-",
            f"{r['drafting_steps']}/{r['decode_steps']}" if key != "mlx-lm" else "-",
            f"{r['verify_ms']:.0f} / {r['plain_ms']:.0f}".replace("nan", "-"),
            f"{r['same_tokens']}/{r['requests']}",
            f"{r['same_as_mlx_lm']}/{r['requests']}",
        ])  # fmt: skip
        if key.endswith("ngram"):
            cells.append(None)
    return render.grid(title, columns, cells)


def cost_table(cost: dict):
    columns = {
        "k": lambda k, _: str(k),
        "ms": lambda _, c: f"{c['ms']:.0f}",
        "x one token": lambda _, c: f"{c['ratio']:.2f}x",
        "extra per token": lambda k, c: f"{(c['ratio'] - 1) / max(k - 1, 1):.3f}",
        "runs": lambda _, c: str(c["runs"]),
    }
    title = f"one forward feeding k tokens at {CONTEXT} tokens of context"
    return render.grid(title, columns, cost)


def goals_of(results: dict[str, dict], batch: int) -> list:
    goals = []
    for name, key, least in GOALS:
        r = results[name][f"{key} ngram"]
        size = 1 if key == "1" else batch
        why = (
            f"accepted length {r['mean_accepted_length']:.2f}, "
            f"{r['speedup_in_steps']:.2f}x counted in each run's own plain steps, "
            f"{100 * r['acceptance_rate']:.0f}% of drafts kept, drafts in "
            f"{r['drafting_steps']} of {r['decode_steps']} decode-only steps, a "
            f"verifying step {r['verify_ms']:.0f} ms vs "
            f"{results[name][f'{key} off']['plain_ms']:.0f} ms plain"
        )
        name = f"{name}, batch {size}: decode tok/s with / without"
        goals.append(at_least(name, r["speedup"], least, why))
    drafted = [r for rows in results.values() for k, r in rows.items() if "ngram" in k]
    same = sum(r["same_tokens"] for r in drafted)
    return goals + [
        identical("greedy tokens identical", same, sum(r["requests"] for r in drafted))
    ]


def main() -> int:
    bench = Bench(
        __doc__,
        quick=True,
        out="bench-results/speculative.json",
        repeats=(None, "runs of each configuration, the fastest kept (default: 2; "
                 "--quick: 1)"),
        time_limit=(900.0, "seconds one run may take before it is cut"),
    )  # fmt: skip
    args = bench.parse()
    console = bench.start()
    requests, max_tokens, batch = SIZES[args.quick]
    repeats = args.repeats or (1 if args.quick else 2)
    models = bench.models()
    model, peer, tokenizer = models.float32, models.peer, models.tokenizer
    console.print(
        f"{requests} requests a workload, max_tokens {max_tokens}, batch 1 and "
        f"{batch}, the fastest of {repeats} runs"
    )
    warm, mixed = warmup_workload(tokenizer), Config("ours", "mixed", 128)
    for speculative in (None, "ngram"):  # every code path compiled once
        run_ours(model, tokenizer, warm, mixed, greedy, 60, 2, speculative=speculative)
    run_mlx_lm_alone(peer, tokenizer.eos_token_ids, warm, "warm", 60)
    with console.status("k tokens in one forward"):
        cost = feed_cost(model, tokenizer, 5 if args.quick else 15, 120)
    console.print(cost_table(cost))
    workloads = {
        "input-grounded": grounded_workload(tokenizer, requests, max_tokens),
        "open-ended chat": chat_workload(tokenizer, requests, max_tokens),
    }
    runs, results = {}, {}
    for name, workload in workloads.items():
        with console.status(name):
            runs[name] = run_workload(
                model, peer, tokenizer, workload, batch, repeats, args.time_limit
            )
        cut = [r.config for r in runs[name].values() if r.unfinished]
        if cut:  # no figure from runs the time limit cut short
            fail(
                f"--time-limit {args.time_limit:g} s cut {len(cut)} {name} runs short "
                f"({', '.join(cut)}): raise it; nothing was written",
                status=1,
            )
        results[name] = rows_of(runs[name])
        console.print(table(f"{name}: {workload.describe()}", results[name]))
    console.print(NOT_RUN)
    image = bench.image("week3-speculative-accepted.png")
    panels = {
        f"{name}, batch {1 if key == '1' else batch}": runs[name][f"{key} ngram"]
        for name in runs
        for key in ("1", "B")
    }
    plots.plot_accepted_lengths(panels, 1 + K, image)
    record = dict(
        sizes=dict(
            requests=requests, max_tokens=max_tokens, batch=batch, repeats=repeats
        ),
        draft_token_cost=course.DRAFT_TOKEN_COST,
        feed_cost=cost,
        workloads={name: w.describe() for name, w in workloads.items()},
        results=results,
        runs=runs,
        not_run=NOT_RUN,
    )
    return bench.finish(record, goals_of(results, batch), [image])


if __name__ == "__main__":
    run_benchmark(main)
