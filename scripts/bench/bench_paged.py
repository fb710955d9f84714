"""The paged KV cache against the dense one and mlx-lm, in one run: `pdm run bench-paged`.

pdm run bench-paged            # every part, the goals met or missed
pdm run bench-paged --quick    # smaller workloads, same parts
pdm run bench-paged --parts chat   # one part (or several), its goals only

Four parts, each on the embedded model, same weights and workload for every runner:
- step: one mixed step (4 decodes + a 32-token chunk), dense, and paged with the
  pool's arrays at 256 and at 4,096 blocks. Goal: 4,096 blocks within 10% of 256
  blocks and within 10% of dense.
- soak: the serving soak's workload (short chat questions, 10% long notes) at batch
  4 and max_seq_len 4096, dense against paged at its default budget. Goal: paged
  peak MLX memory no higher than dense, same tokens.
- budget: one KV budget of 4 x max_seq_len positions; dense fits batch_size 4 in it,
  paged runs batch_size 16 in the same bytes, on long and short prompts. Goal: at
  least 2x the requests decoding at once, same tokens.
- chat: a 10-turn chat replayed, each turn resending the conversation; ours with
  prefix caching (and without, for scale) beside mlx-lm's LRUPromptCache. Goals: at
  least 90% of the reusable prompt tokens from the cache, turn 10's time to first
  token within 1.3x turn 2's (each the median of the replays).
- kv: each kv_dtype beside float32 keys and values (benchlib/kv_dtypes.py): tokens
  that fit and requests running at one budget, a decode step of rows 2,000, 500,
  500 and 500 long, and on 20 chat prompts whether greedy decoding keeps float32's
  256 tokens, with the max logit error. Goals (each quantized dtype): at least 1.8x
  the requests running, the decode step within 1.1x, float32's tokens on at least
  90% of the prompts.
Writes a table per part, JSON (--out) and, when the first four parts ran, the plot
(week3-02-paged.png beside the JSON; into book/src/images with --book-figures).
"""

from scripts.commands.interrupt import exit_on_interrupt

exit_on_interrupt()  # first: Ctrl-C during the imports below never shows a traceback

import tiny_llm_base  # noqa: F401  (first: the fast BLAS before mlx.core)

# isort: split
import statistics
import time

import mlx.core as mx

from scripts.bench.benchlib import plots
from scripts.bench.benchlib.course import course, run_benchmark
from scripts.bench.benchlib.harness import Bench, interleaved, medians
from scripts.bench.benchlib.goals import at_least, at_most, identical
from scripts.bench.benchlib.chats import (
    engine_replies,
    mlx_lm_replies,
    replay,
    reusable,
)
from scripts.bench.benchlib.kv_dtypes import kv_part, kv_table
from scripts.bench.benchlib.prompt_texts import LIGHTHOUSE_TURNS
from scripts.bench.benchlib.runners import all_decoding, paged_engine
from scripts.bench.benchlib.runners import peak_memory_run, run_to_end
from scripts.bench.benchlib.workloads import long_prompt
from scripts.bench.loadlib.workload import make_workload
from tiny_llm_base import PromptSpec
from tiny_llm_base.memory import kv_bytes_per_token
from tiny_llm_base.mlx_lm_reference import chat_ids

CHAT_TURNS = LIGHTHOUSE_TURNS


# --- step: a mixed step's time against the pool's size ----------------------------


def step_seconds(model, tokenizer, sampler, kv_cache: str, pool_blocks: int | None):
    """The median wall time of the mixed steps that feed 4 decodes and a 32-token
    chunk. With pool_blocks, the paged pool's arrays are grown to that many blocks
    first (as a long-running server's would be)."""
    settings = dict(num_blocks=4096, prefix_caching=False) if pool_blocks else {}
    engine = course.Engine(
        model,
        tokenizer,
        batch_size=5,
        max_seq_len=1024,
        prefill_step=32,
        policy="mixed",
        kv_cache=kv_cache,
        sampler=sampler,
        **settings,
    )
    short = [chat_ids(tokenizer, q) for q in CHAT_TURNS[:4]]
    all_decoding(engine, [PromptSpec(prompt, max_tokens=400) for prompt in short])
    if pool_blocks:
        for layer in engine.kv.layer_blocks:
            _, H, _, D = layer.keys.shape
            layer.grow(pool_blocks, H, D, layer.keys.dtype)
        mx.eval(
            [a for layer in engine.kv.layer_blocks for a in (layer.keys, layer.values)]
        )
    engine.add_request(PromptSpec(long_prompt(tokenizer, 700, seed=1), max_tokens=1))
    times = []
    while len(times) < 16:
        start = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - start)
    return statistics.median(times[2:])


def step_part(model, tokenizer, sampler, repeats: int) -> dict:
    runners = {"dense": ("dense", None), "paged, 256 blocks": ("paged", 256)}
    runners["paged, 4,096 blocks"] = ("paged", 4096)
    jobs = {
        name: lambda c=kv_cache, b=blocks: step_seconds(model, tokenizer, sampler, c, b)
        for name, (kv_cache, blocks) in runners.items()
    }
    seconds = medians(interleaved(jobs, repeats))
    big, small = seconds["paged, 4,096 blocks"], seconds["paged, 256 blocks"]
    dense = seconds["dense"]
    big_ms, small_ms, dense_ms = (f"{1000 * t:.0f} ms" for t in (big, small, dense))
    return dict(
        seconds=seconds,
        goals=[
            at_most(
                "paged step, 4,096 blocks / 256 blocks",
                big / small,
                1.1,
                f"{big_ms} at 4,096 blocks vs {small_ms} at 256",
            ),
            at_most(
                "paged step, 4,096 blocks / dense",
                big / dense,
                1.1,
                f"{big_ms} at 4,096 blocks vs {dense_ms} dense",
            ),
        ],
    )


# --- soak: peak memory on the serving soak's workload -----------------------------


def soak_specs(tokenizer, count: int, max_tokens: int) -> list[PromptSpec]:
    workload = make_workload(count, 1.0, max_tokens, long_fraction=0.1, seed=11)
    return [
        PromptSpec(
            chat_ids(tokenizer, r.question),
            max_tokens=r.max_tokens,
        )
        for r in workload
    ]


def soak_part(model, tokenizer, count: int) -> dict:
    specs = soak_specs(tokenizer, count, 48)
    shared = dict(batch_size=4, max_seq_len=4096, prefill_step=128, policy="mixed")
    dense, dense_tokens = peak_memory_run(
        model, tokenizer, specs, kv_cache="dense", **shared
    )
    paged, paged_tokens = peak_memory_run(
        model, tokenizer, specs, kv_cache="paged", **shared
    )
    same = sum(a == b for a, b in zip(dense_tokens, paged_tokens))
    why = f"paged {paged / 2**20:,.0f} MiB vs dense {dense / 2**20:,.0f} MiB"
    return dict(
        requests=count,
        peak_bytes={"dense": dense, "paged": paged},
        goals=[
            at_most("soak: peak memory, paged / dense", paged / dense, 1.0, why),
            identical("soak: the same tokens dense and paged", same, len(specs)),
        ],
    )


# --- budget: requests running at once in the same bytes --------------------------


def budget_part(model, tokenizer, sampler, short_count: int) -> dict:
    max_seq_len = 1024
    per_token = kv_bytes_per_token(model)
    budget = 4 * max_seq_len * per_token
    prompts = [
        long_prompt(tokenizer, 600, seed=2),
        long_prompt(tokenizer, 700, seed=1),
    ] + [chat_ids(tokenizer, q) for q in soak_questions(short_count)]
    specs = [PromptSpec(p, max_tokens=24, sampler=sampler) for p in prompts]
    runs = {}
    for name, kv_cache, batch_size in (("dense", "dense", 4), ("paged", "paged", 16)):
        decoding = []
        engine = course.Engine(
            model,
            tokenizer,
            batch_size=batch_size,
            max_seq_len=max_seq_len,
            prefill_step=128,
            policy="mixed",
            kv_cache=kv_cache,
            kv_memory=budget,
        )
        start = time.perf_counter()
        results = run_to_end(
            engine,
            specs,
            lambda e, _, __, seen=decoding: seen.append(len(e.planner.decoding())),
        )
        runs[name] = dict(
            batch_size=batch_size,
            most_decoding=max(decoding),
            decoding=decoding,
            seconds=time.perf_counter() - start,
            preemptions=engine.metrics.preemptions,
            tokens=[r.tokens for r in results],
        )
    paged, dense = runs["paged"], runs["dense"]
    same = sum(a == b for a, b in zip(paged["tokens"], dense["tokens"]))
    why = (
        f"paged {paged['most_decoding']} at once ({paged['preemptions']} "
        f"preemptions) vs dense {dense['most_decoding']}"
    )
    return dict(
        budget_bytes=budget,
        budget_tokens=4 * max_seq_len,
        runs=runs,
        goals=[
            at_least(
                "budget: requests decoding at once, paged / dense",
                paged["most_decoding"] / dense["most_decoding"],
                2,
                why,
            ),
            identical("budget: the same tokens dense and paged", same, len(specs)),
        ],
    )


def soak_questions(count: int) -> list[str]:
    return [r.question for r in make_workload(count, 1.0, 8, long_fraction=0.0, seed=5)]


# --- chat: a 10-turn replay ---------------------------------------------------------


def chat_turns(tokenizer, answer) -> dict:
    """One replay of CHAT_TURNS (answer(prompt) -> Reply): per turn its TTFT, the
    tokens found cached, the reusable tokens (chats.reusable) and its tokens."""
    replies = replay(tokenizer, CHAT_TURNS, answer)
    before = [None, *replies]
    return dict(
        ttft=[r.ttft for r in replies],
        cached=[r.cached for r in replies],
        reusable=[
            reusable(r.prompt, b.prompt, b.tokens) if b else 0
            for r, b in zip(replies, before)
        ],
        tokens=[r.tokens for r in replies],
    )


def chat_engine(model, tokenizer, caching: bool, max_tokens: int) -> dict:
    """One replay through a paged Engine."""
    engine = paged_engine(
        model, tokenizer, batch_size=4, max_seq_len=4096, prefix_caching=caching
    )
    return chat_turns(tokenizer, engine_replies(engine, max_tokens))


def chat_mlx_lm(peer, tokenizer, max_tokens: int) -> dict:
    """The same replay through mlx-lm's generate_step and its server's LRUPromptCache."""
    return chat_turns(tokenizer, mlx_lm_replies(peer, tokenizer, max_tokens))


def chat_part(model, mlx_model, tokenizer, replays: int, max_tokens: int) -> dict:
    runners = {
        "ours, caching on": lambda: chat_engine(model, tokenizer, True, max_tokens),
        "ours, caching off": lambda: chat_engine(model, tokenizer, False, max_tokens),
        "mlx-lm, LRUPromptCache": lambda: chat_mlx_lm(mlx_model, tokenizer, max_tokens),
    }
    runs = {name: [] for name in runners}
    for _ in range(replays):
        for name, run in runners.items():
            runs[name].append(run())
    summary = {}
    for name, replays_of in runs.items():
        first = replays_of[0]
        ttft = [
            statistics.median(r["ttft"][t] for r in replays_of)
            for t in range(len(CHAT_TURNS))
        ]
        reusable, cached = sum(first["reusable"][1:]), sum(first["cached"][1:])
        summary[name] = dict(
            ttft=ttft,
            cached=first["cached"],
            reusable=first["reusable"],
            hit=cached / reusable if reusable else 0.0,
            turn10_over_turn2=ttft[-1] / ttft[1],
            tokens=first["tokens"],
        )
    ours, off = summary["ours, caching on"], summary["ours, caching off"]
    same = sum(a == b for a, b in zip(ours["tokens"], off["tokens"]))
    cached, reusable = sum(ours["cached"][1:]), sum(ours["reusable"][1:])
    first, last = (f"{1000 * ours['ttft'][t]:.0f} ms" for t in (1, -1))
    ttft = f"turn 2 {first}, turn 10 {last}"
    return dict(
        turns=summary,
        goals=[
            at_least(
                "chat: reusable prompt tokens found cached, turns 2-10",
                ours["hit"],
                0.9,
                f"{cached} of {reusable} tokens",
            ),
            at_most(
                "chat: TTFT turn 10 / turn 2", ours["turn10_over_turn2"], 1.3, ttft
            ),
            identical(
                "chat: the same tokens with caching on and off", same, len(CHAT_TURNS)
            ),
        ],
    )


# --- report -------------------------------------------------------------------------


PARTS = ("step", "soak", "budget", "chat", "kv")
PLOTTED = PARTS[:4]


def tables(bench, parts: dict) -> None:
    """One table for each part that ran, a row per runner."""
    runner = {"runner": lambda name, _: name}
    if step := parts.get("step"):
        title = "step: 4 decodes + a 32-token chunk, one mixed step"
        median = {"median step": lambda _, seconds: f"{1000 * seconds:.0f} ms"}
        bench.table(title, runner | median, step["seconds"])
    if soak := parts.get("soak"):
        title = f"soak: {soak['requests']} requests at batch 4, max_seq_len 4096"
        peak = {"peak MLX memory above the start": lambda _, b: f"{b / 2**20:,.0f} MiB"}
        bench.table(title, runner | peak, soak["peak_bytes"])
    if budget := parts.get("budget"):
        title = (
            f"budget: {budget['budget_bytes'] / 2**20:,.0f} MiB = "
            f"{budget['budget_tokens']:,} tokens, 2 long + short prompts"
        )
        columns = runner | {
            "batch_size": lambda _, run: str(run["batch_size"]),
            "most decoding at once": lambda _, run: str(run["most_decoding"]),
            "preemptions": lambda _, run: str(run["preemptions"]),
            "total": lambda _, run: f"{run['seconds']:.1f} s",
        }
        bench.table(title, columns, budget["runs"])
    if chats := parts.get("chat"):
        title = "chat: a 10-turn replay (TTFT: median of the replays)"
        columns = runner | {
            "hit (turns 2-10)": lambda _, run: f"{run['hit']:.0%}",
            "TTFT turn 2": lambda _, run: f"{1000 * run['ttft'][1]:.0f} ms",
            "TTFT turn 10": lambda _, run: f"{1000 * run['ttft'][-1]:.0f} ms",
            "10 / 2": lambda _, run: f"{run['turn10_over_turn2']:.2f}",
        }
        bench.table(title, columns, chats["turns"])
    if kv := parts.get("kv"):
        kv_table(bench.console, kv)


def main() -> int:
    bench = Bench(__doc__, quick=True, out="bench-results/paged.json")
    help = "the parts to run (default: all five; the chat part needs week 3 day 3)"
    bench.option("--parts", list(PARTS), help, choices=PARTS)
    args = bench.parse()
    bench.start()
    models = bench.models()
    served, exact, tokenizer = models.served, models.float32, models.tokenizer
    sampler = models.no_eos
    runs = {
        "step": lambda: step_part(served, tokenizer, sampler, 1 if args.quick else 3),
        "soak": lambda: soak_part(served, tokenizer, 12 if args.quick else 32),
        "budget": lambda: budget_part(
            served, tokenizer, sampler, 10 if args.quick else 14
        ),
        "chat": lambda: chat_part(
            exact, models.peer, tokenizer, 1 if args.quick else 3, 32
        ),
        "kv": lambda: kv_part(exact, tokenizer, sampler, args.quick),
    }
    parts = {}
    for name in [name for name in PARTS if name in args.parts]:
        parts[name] = runs[name]()
        bench.keep(name, parts[name], parts[name]["goals"], leave_out="tokens")
    tables(bench, parts)
    goals = [g for part in parts.values() for g in part.pop("goals")]
    wrote = []
    if all(name in parts for name in PLOTTED):
        wrote.append(bench.image("week3-02-paged.png"))
        plots.plot_paged(*(parts[name] for name in PLOTTED), wrote[0])
    record = dict(quick=args.quick, **parts)
    if "chat" in parts:
        record["chat"] = parts["chat"]["turns"]
    return bench.finish(record, goals, wrote, leave_out="tokens")


if __name__ == "__main__":
    run_benchmark(main)
