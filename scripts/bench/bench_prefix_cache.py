"""Prefix caching measured: how much prefill a shared prompt start saves.

pdm run bench-prefix-cache            # both workloads, full size
pdm run bench-prefix-cache --quick    # smaller prompts, fewer requests

Workload a: 16 requests with one ~1,500-token system prompt and short distinct
questions; the first arrives at step 0, the others one per engine step once it has
prefilled. Workload b: a 4-turn chat, each turn resending the conversation so far.
Each runs on our engine (paged KV cache) with prefix caching on and off, and on
mlx-lm alone with its server's LRUPromptCache (each request after the previous).
Reported: TTFT p50/p99, prompt tokens computed, hit rate, peak KV memory against the
dense preallocation, and whether the output tokens are identical with caching on and
off; the issue's goals met or missed. Table on the terminal, JSON and a plot in
book/src/images/.
"""

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import tiny_llm_base  # noqa: F401  (first: the fast BLAS before mlx.core)
import mlx.core as mx
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.server import LRUPromptCache
from rich.console import Console
from rich.table import Table

from scripts.bench.benchlib.course import add_option, course, run_benchmark, use
from scripts.commands.cli import option_parser
from tiny_llm_base import PromptSpec, load_model
from tiny_llm_base.mlx_lm_reference import float32_copy

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ROOT / "book/src/images"
BATCH_SIZE = 4
BLOCK_SIZE = 16
QUESTIONS = [
    "Which note mentions the river?",
    "Summarize the notes in one line.",
    "What changed the most?",
    "Name one quiet week.",
    "Which topic comes up twice?",
    "What is the first note about?",
    "Give the last note's number.",
    "Is anything about bread?",
    "Which percent is the largest?",
    "Pick a note to read aloud.",
    "What happened on day 3?",
    "Are there more than ten notes?",
    "Which note is the shortest?",
    "Say one word about the notes.",
    "What would you ask next?",
    "Which note sounds odd?",
]
CHAT_TURNS = [
    "Tell me about lighthouses.",
    "Why were they painted in stripes?",
    "Who kept them running?",
    "Are any still staffed today?",
]
TOPICS = ["the river level", "bread prices", "the bus timetable", "garden rain"]


@dataclass
class Result:
    """One run of a workload: per-request TTFT and tokens, and the run's counts."""

    runner: str
    ttft: list[float] = field(default_factory=list)
    tokens: list[list[int]] = field(default_factory=list)
    prompt_tokens: int = 0
    computed_tokens: int = 0
    cached_tokens: int = 0
    peak_kv_tokens: int | None = None
    dense_kv_tokens: int | None = None
    seconds: float = 0.0

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def percentile(self, q: float) -> float:
        ordered = sorted(self.ttft)
        return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def system_prompt(tokens: int, tokenizer) -> str:
    """Numbered notes until the text is about `tokens` tokens long."""
    notes = []
    while len(tokenizer.encode("\n".join(notes))) < tokens:
        i = len(notes)
        notes.append(
            f"Note {i + 1}: on day {i % 28 + 1} {TOPICS[i % len(TOPICS)]} changed by "
            f"{(7 * i) % 88 + 2} percent after {(i % 11) + 1} quiet weeks."
        )
    return "\n".join(notes)


def chat(tokenizer, messages: list[dict]) -> list[int]:
    return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True))


def run_engine(model, tokenizer, prompts, arrivals, max_tokens, caching) -> Result:
    """All prompts through one paged Engine, each admitted at its arrival step."""
    max_seq_len = max(len(p) for p in prompts) + max_tokens
    engine = course.Engine(
        model,
        tokenizer,
        batch_size=BATCH_SIZE,
        max_seq_len=max_seq_len,
        prefill_step=512,
        policy="mixed",
        kv_cache="paged",
        block_size=BLOCK_SIZE,
        prefix_caching=caching,
    )
    start = time.perf_counter()
    ids = [
        engine.add_request(PromptSpec(p, max_tokens=max_tokens, arrival_step=a))
        for p, a in zip(prompts, arrivals)
    ]
    results = {}
    while engine.has_unfinished():
        for output in engine.step():
            if output.result is not None:
                results[output.request_id] = output.result
    return summarize(
        f"ours, caching {'on' if caching else 'off'}",
        [results[i] for i in ids],
        engine.metrics,
        time.perf_counter() - start,
    )


def summarize(runner, results, metrics, seconds) -> Result:
    return Result(
        runner,
        [r.metrics.time_to_first_token for r in results],
        [r.tokens for r in results],
        sum(r.metrics.prompt_tokens for r in results),
        metrics.prefill_tokens,
        metrics.prefix_cached_tokens,
        metrics.kv_peak_tokens,
        metrics.kv_dense_tokens,
        seconds,
    )


def run_chat_engine(model, tokenizer, turns, max_tokens, caching) -> Result:
    """A chat through one Engine: each turn waits for the previous answer."""
    engine = course.Engine(
        model,
        tokenizer,
        batch_size=BATCH_SIZE,
        max_seq_len=2048,
        prefill_step=512,
        policy="mixed",
        kv_cache="paged",
        block_size=BLOCK_SIZE,
        prefix_caching=caching,
    )
    messages, results = [], []
    start = time.perf_counter()
    for question in turns:
        messages.append({"role": "user", "content": question})
        engine.add_request(PromptSpec(chat(tokenizer, messages), max_tokens=max_tokens))
        while engine.has_unfinished():
            for output in engine.step():
                if output.result is not None:
                    results.append(output.result)
        messages.append({"role": "assistant", "content": results[-1].text})
    return summarize(
        f"ours, caching {'on' if caching else 'off'}",
        results,
        engine.metrics,
        time.perf_counter() - start,
    )


def mlx_lm_one(mlx_model, prompt, max_tokens, lru: LRUPromptCache, result: Result):
    """One request on mlx-lm alone, starting from the LRU cache's nearest entry."""
    start = time.perf_counter()
    cache, rest = lru.fetch_nearest_cache("model", prompt)
    if cache is None:
        cache = make_prompt_cache(mlx_model)
    tokens, first = [], None
    for token, _ in generate_step(
        mx.array(rest), mlx_model, max_tokens=max_tokens, prompt_cache=cache
    ):
        first = first or time.perf_counter()
        tokens.append(token)
    result.ttft.append(first - start)
    result.tokens.append(tokens)
    result.prompt_tokens += len(prompt)
    result.computed_tokens += len(rest)
    result.cached_tokens += len(prompt) - len(rest)
    held = cache[0].offset
    lru.insert_cache("model", (prompt + tokens)[:held], cache)
    return tokens


def run_mlx_lm(mlx_model, prompts, max_tokens) -> Result:
    result, lru = Result("mlx-lm, LRUPromptCache"), LRUPromptCache()
    start = time.perf_counter()
    for prompt in prompts:
        mlx_lm_one(mlx_model, prompt, max_tokens, lru, result)
    result.seconds = time.perf_counter() - start
    return result


def run_chat_mlx_lm(mlx_model, tokenizer, turns, max_tokens) -> Result:
    result, lru = Result("mlx-lm, LRUPromptCache"), LRUPromptCache()
    messages = []
    start = time.perf_counter()
    for question in turns:
        messages.append({"role": "user", "content": question})
        tokens = mlx_lm_one(
            mlx_model, chat(tokenizer, messages), max_tokens, lru, result
        )
        eos = set(tokenizer.eos_token_ids)
        text = tokenizer.decode([t for t in tokens if t not in eos])
        messages.append({"role": "assistant", "content": text})
    result.seconds = time.perf_counter() - start
    return result


def goals(a: list[Result], shareable: int) -> list[dict]:
    off, on = a[0], a[1]
    ratio = off.percentile(50) / on.percentile(50)
    hit = on.cached_tokens / shareable
    memory = on.peak_kv_tokens / on.dense_kv_tokens
    return [
        dict(
            goal="TTFT p50 at least 5x lower with caching (a)",
            value=ratio,
            met=ratio >= 5,
        ),
        dict(
            goal="hit rate at least 90% of the shareable tokens (a)",
            value=hit,
            met=hit >= 0.9,
        ),
        dict(
            goal="peak KV memory at most half the dense preallocation (a)",
            value=memory,
            met=memory <= 0.5,
        ),
        dict(
            goal="output tokens identical with caching on and off (a)",
            value=on.tokens == off.tokens,
            met=on.tokens == off.tokens,
        ),
    ]


def table(title: str, results: list[Result]) -> Table:
    out = Table(title=title)
    for column in (
        "runner",
        "TTFT p50",
        "TTFT p99",
        "prompt tokens",
        "computed",
        "hit rate",
        "peak KV / dense",
        "total",
    ):
        out.add_column(column, justify="left" if column == "runner" else "right")
    for r in results:
        memory = (
            f"{r.peak_kv_tokens} / {r.dense_kv_tokens} positions"
            if r.peak_kv_tokens is not None
            else "-"
        )
        out.add_row(
            r.runner,
            f"{r.percentile(50):.2f} s",
            f"{r.percentile(99):.2f} s",
            str(r.prompt_tokens),
            str(r.computed_tokens),
            f"{100 * r.hit_rate:.0f}%",
            memory,
            f"{r.seconds:.1f} s",
        )
    return out


def plot(cases: dict[str, list[Result]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, (name, results) in zip(axes, cases.items()):
        labels = [r.runner.replace(", ", "\n") for r in results]
        p50 = [r.percentile(50) for r in results]
        p99 = [r.percentile(99) for r in results]
        x = range(len(results))
        ax.bar([i - 0.2 for i in x], p50, 0.4, label="TTFT p50")
        ax.bar([i + 0.2 for i in x], p99, 0.4, label="TTFT p99")
        ax.set_xticks(list(x), labels, fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("seconds (log)")
        ax.set_title(name, fontsize=10)
        for i, r in enumerate(results):
            ax.annotate(
                f"hit {100 * r.hit_rate:.0f}%",
                (i, max(p50[i], p99[i])),
                ha="center",
                va="bottom",
                fontsize=8,
            )
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    parser = option_parser(__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", default="bench-results/prefix_cache.json")
    add_option(parser)
    args = parser.parse_args()
    use(args)
    console = Console(width=150)
    mlx_model, tokenizer = load_model()
    reference = float32_copy(mlx_model)
    model = course.Qwen2ModelWeek2(mlx_model, weights="float32", use_fast_kernels=True)
    system_tokens, requests, max_tokens = (600, 8, 6) if args.quick else (1500, 16, 8)
    system = system_prompt(system_tokens, tokenizer)
    prompts = [
        chat(
            tokenizer,
            [{"role": "system", "content": system}, {"role": "user", "content": q}],
        )
        for q in QUESTIONS[:requests]
    ]
    shared = min(
        next(i for i, (x, y) in enumerate(zip(prompts[0], p)) if x != y)
        for p in prompts[1:]
    )
    shareable = (requests - 1) * (shared // BLOCK_SIZE * BLOCK_SIZE)
    # The first prefills alone (512-token chunks); the others arrive a step apart.
    first_done = -(-len(prompts[0]) // 512) + 1
    arrivals = [0] + [first_done + i for i in range(requests - 1)]
    run_engine(model, tokenizer, prompts[:2], [0, 0], 2, True)  # warm up
    case_a = [
        run_engine(model, tokenizer, prompts, arrivals, max_tokens, caching)
        for caching in (False, True)
    ]
    case_a.append(run_mlx_lm(reference, prompts, max_tokens))
    turns = CHAT_TURNS
    case_b = [
        run_chat_engine(model, tokenizer, turns, 24, caching)
        for caching in (False, True)
    ]
    case_b.append(run_chat_mlx_lm(reference, tokenizer, turns, 24))
    met = goals(case_a, shareable)
    console.print(
        table(
            f"a: {requests} requests, {len(prompts[0])}-token prompts sharing {shared}",
            case_a,
        )
    )
    console.print(table(f"b: a {len(turns)}-turn chat, resent whole each turn", case_b))
    for goal in met:
        value = goal["value"]
        shown = f"{value:.2f}" if isinstance(value, float) else str(value)
        console.print(f"{'MET ' if goal['met'] else 'MISSED'} {goal['goal']}: {shown}")
    suffix = "-quick" if args.quick else ""
    IMAGES.mkdir(parents=True, exist_ok=True)
    image = IMAGES / f"week3-03-prefix-cache{suffix}.png"
    plot({"a: shared system prompt": case_a, "b: multi-turn chat": case_b}, image)
    record = {
        "meta": {
            "quick": args.quick,
            "batch_size": BATCH_SIZE,
            "block_size": BLOCK_SIZE,
            "cpus": os.cpu_count(),
            "device": str(mx.default_device()),
            "shared_tokens": shared,
            "shareable_tokens": shareable,
        },
        "cases": {
            "a": [
                dict(
                    asdict(r),
                    hit_rate=r.hit_rate,
                    ttft_p50=r.percentile(50),
                    ttft_p99=r.percentile(99),
                )
                for r in case_a
            ],
            "b": [
                dict(
                    asdict(r),
                    hit_rate=r.hit_rate,
                    ttft_p50=r.percentile(50),
                    ttft_p99=r.percentile(99),
                )
                for r in case_b
            ],
        },
        "goals": met,
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(record, indent=2, default=str))
    console.print(f"wrote {args.json} and {image.relative_to(ROOT)}")
    return 0 if all(g["met"] for g in met) else 1


if __name__ == "__main__":
    run_benchmark(main)
