"""The paged pool's kv_dtypes against float32 keys and values, in one run (bench-paged's
kv part): how many requests one KV budget runs, the decode step's time, and whether
greedy decoding keeps float32's tokens.

    kv = kv_part(model, tokenizer, sampler, quick=False)   # its goals included
    kv_table(console, kv)

Agreement is checked without decoding each kv_dtype again: float32's greedy tokens
(the engine's, 256 a prompt) are fed back in one forward whose attention reads
every key and value from a pool of the kv_dtype. Greedy decoding on that pool gives
float32's tokens exactly when its pick at every position is float32's token; the
first position that differs is where its own answer would turn. Every figure of a
kv_dtype is taken beside float32's in the same run.
"""

import statistics
import time

import mlx.core as mx

from scripts.bench.benchlib import render
from scripts.bench.benchlib.course import course
from scripts.bench.benchlib.harness import interleaved, medians
from scripts.bench.benchlib.goals import at_least, at_most
from scripts.bench.benchlib.paged_step import decode_step, paged_batch
from scripts.bench.benchlib.prompt_texts import SHORT_QUESTIONS
from scripts.bench.benchlib.runners import run_to_end
from scripts.bench.benchlib.workloads import long_prompt
from tiny_llm_base import PromptSpec
from tiny_llm_base.memory import KV_DTYPES, kv_bytes_per_token
from tiny_llm_base.mlx_lm_reference import chat_ids

MORE_QUESTIONS = [
    "Tell me about lighthouses.",
    "How does a refrigerator keep food cold?",
    "Explain what a prime number is.",
    "Write a short poem about the sea.",
    "What should I pack for a weekend hike?",
    "How do bees make honey?",
    "Describe a good breakfast.",
    "Why do leaves change color in autumn?",
    "What is the difference between weather and climate?",
    "Give me three tips for learning to cook.",
]
SUITE = SHORT_QUESTIONS + MORE_QUESTIONS  # 20 chat prompts
BUDGET_REQUESTS = 4  # float32 requests the budget holds
MAX_SEQ_LEN = 128
STEP_LENGTHS = [2000, 500, 500, 500]


def running(model, tokenizer, sampler, kv_dtype: str, count: int) -> dict:
    """Requests decoding at once when `count` 100-token prompts (8 tokens each)
    share a budget of BUDGET_REQUESTS x MAX_SEQ_LEN float32 positions."""
    budget = BUDGET_REQUESTS * MAX_SEQ_LEN * kv_bytes_per_token(model)
    engine = course.Engine(
        model,
        tokenizer,
        batch_size=count,
        max_seq_len=MAX_SEQ_LEN,
        prefill_step=512,
        policy="mixed",
        kv_cache="paged",
        kv_memory=budget,
        kv_dtype=kv_dtype,
        prefix_caching=False,
    )
    specs = [
        PromptSpec(long_prompt(tokenizer, 100, seed=s), max_tokens=8, sampler=sampler)
        for s in range(count)
    ]
    seen = []
    run_to_end(engine, specs, lambda e, _, __: seen.append(len(e.planner.decoding())))
    return dict(
        budget_bytes=budget,
        tokens_fit=engine.kv.pool.num_blocks * engine.kv.block_size,
        most_decoding=max(seen),
        preemptions=engine.metrics.preemptions,
    )


def generate(model, tokenizer, sampler, max_tokens: int) -> list:
    """float32's greedy tokens of every SUITE prompt, all in one batch."""
    engine = course.Engine(
        model,
        tokenizer,
        batch_size=len(SUITE),
        max_seq_len=max_tokens + 128,
        prefill_step=512,
        policy="mixed",
        kv_cache="paged",
        kv_memory=len(SUITE) * (max_tokens + 128) * kv_bytes_per_token(model),
    )
    specs = [
        PromptSpec(chat_ids(tokenizer, q), max_tokens=max_tokens, sampler=sampler)
        for q in SUITE
    ]
    return [r.tokens for r in run_to_end(engine, specs)]


def forced_logits(model, kv_dtype: str, ids: list[int]) -> mx.array:
    """Logits [L, V] of `ids` in one forward whose attention reads every key and
    value back from a pool of kv_dtype (as a decode step reads them)."""
    size = 16
    blocks = course.blocks_needed(len(ids), size)
    table = course.BlockTable(list(range(blocks)))
    caches = [
        course.PagedKvCache(
            course.LayerBlocks(blocks, size)
            if kv_dtype == "float32"
            else course.QuantizedLayerBlocks(blocks, size, kv_dtype),
            table,
        )
        for _ in model.create_kv_cache()
    ]
    logits = model(mx.array([ids]), 0, caches)[0]
    mx.eval(logits)
    return logits


def agreement(model, tokenizer, sampler, outputs: list) -> dict:
    """Each SUITE prompt followed by float32's greedy tokens, in one forward reading
    a pool of each kv_dtype: {kv_dtype: the first position of each prompt whose
    greedy pick is not float32's token (None: every one is, so greedy decoding on
    this pool gives float32's tokens), and the largest |logit - float32's forward's
    logit|}. float32's own row is the check's resolution: its one forward against
    the engine's steps."""
    found = {d: dict(first_difference=[], max_logit_error=0.0) for d in KV_DTYPES}
    for question, tokens in zip(SUITE, outputs):
        prompt = chat_ids(tokenizer, question)
        exact = forced_logits(model, "float32", prompt + tokens)
        for d, seen in found.items():
            other = (
                exact if d == "float32" else forced_logits(model, d, prompt + tokens)
            )
            error = mx.max(mx.abs(other - exact)).item()
            seen["max_logit_error"] = max(seen["max_logit_error"], error)
            picks = sampler(other[len(prompt) - 1 : -1]).tolist()
            differ = (p for p, (a, b) in enumerate(zip(picks, tokens)) if a != b)
            seen["first_difference"].append(next(differ, None))
    return found


def step_seconds(model, rounds: int) -> dict[str, list[float]]:
    """Seconds of decode steps of STEP_LENGTHS rows read from a pool of each
    kv_dtype: every round times one step of each, in turn (a busy spell of the
    machine slows one step of each, not every step of one)."""
    batches = {d: paged_batch(model, STEP_LENGTHS, d) for d in KV_DTYPES}
    for batch in batches.values():
        decode_step(model, batch)
    return interleaved(
        {d: lambda b=batch: decode_step(model, b) for d, batch in batches.items()},
        rounds,
    )


def kv_part(model, tokenizer, sampler, quick: bool) -> dict:
    """Every KV_DTYPES beside float32; the goals of the quantized ones."""
    max_tokens = 64 if quick else 256
    count = 12 if quick else 20
    started = time.perf_counter()
    tokens = generate(model, tokenizer, sampler, max_tokens)
    agreed = agreement(model, tokenizer, sampler, tokens)
    rounds = step_seconds(model, 4 if quick else 8)
    steps = medians(rounds)
    fit = {d: running(model, tokenizer, sampler, d, count) for d in KV_DTYPES}
    runs = {}
    for d, agree in agreed.items():
        differ = [i for i, p in enumerate(agree["first_difference"]) if p is not None]
        runs[d] = dict(
            **fit[d],
            requests_ratio=fit[d]["most_decoding"] / fit["float32"]["most_decoding"],
            step_seconds=steps[d],
            step_ratio=statistics.median(
                a / b for a, b in zip(rounds[d], rounds["float32"])
            ),
            agree=1 - len(differ) / len(SUITE),
            differ={SUITE[i]: agree["first_difference"][i] for i in differ},
            max_logit_error=agree["max_logit_error"],
        )
    goals = []
    for d in KV_DTYPES[1:]:
        run = runs[d]
        goals += [
            at_least(
                f"kv {d}: requests running at one budget / float32",
                run["requests_ratio"],
                1.8,
                f"{run['most_decoding']} vs {fit['float32']['most_decoding']} "
                f"({run['tokens_fit']:,} vs {fit['float32']['tokens_fit']:,} tokens fit)",
            ),
            at_most(
                f"kv {d}: decode step / float32",
                run["step_ratio"],
                1.1,
                f"{1000 * run['step_seconds']:.0f} ms vs "
                f"{1000 * steps['float32']:.0f} ms, rows {STEP_LENGTHS}",
            ),
            at_least(
                f"kv {d}: greedy tokens identical to float32's over {max_tokens}",
                run["agree"],
                0.9,
                f"{len(SUITE) - len(run['differ'])} of {len(SUITE)} prompts; max "
                f"logit error {run['max_logit_error']:.3f}",
            ),
        ]
    return dict(
        suite=len(SUITE),
        max_tokens=max_tokens,
        requests=count,
        step_lengths=STEP_LENGTHS,
        seconds=time.perf_counter() - started,
        runs=runs,
        goals=goals,
    )


def kv_table(console, kv: dict) -> None:
    """The kv part's one table."""
    budget = kv["runs"]["float32"]["budget_bytes"]
    title = (
        f"kv: budget {budget / 2**20:,.1f} MiB ({BUDGET_REQUESTS} x {MAX_SEQ_LEN} "
        f"float32 tokens, {kv['requests']} 100-token prompts); decode step rows "
        f"{kv['step_lengths']}; greedy over {kv['max_tokens']} tokens, "
        f"{kv['suite']} chat prompts"
    )
    columns = [
        "kv_dtype", "tokens that fit", "running at once", "x float32",
        "decode step", "x float32", "identical", "max logit error",
    ]  # fmt: skip
    rows = [
        [
            d, f"{r['tokens_fit']:,}", str(r["most_decoding"]),
            f"{r['requests_ratio']:.2f}", f"{1000 * r['step_seconds']:.0f} ms",
            f"{r['step_ratio']:.2f}", f"{100 * r['agree']:.0f}%",
            f"{r['max_logit_error']:.3f}",
        ]
        for d, r in kv["runs"].items()
    ]  # fmt: skip
    console.print(render.grid(title, columns, rows))
