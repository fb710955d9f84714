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
off; its goals met or missed. Table on the terminal, JSON and a plot beside
it (into book/src/images with --book-figures).
"""

import tiny_llm_base  # noqa: F401  (first: the fast BLAS before mlx.core)

# isort: split
import time
from dataclasses import asdict, dataclass, field

from mlx_lm.server import LRUPromptCache

from scripts.bench.benchlib import plots, render
from scripts.bench.benchlib.course import run_benchmark
from scripts.bench.benchlib.harness import Bench, at_least, at_most, identical
from scripts.bench.benchlib.runners import mlx_lm_cached, paged_engine, run_to_end
from scripts.bench.benchlib.workloads import chat, replay_chat
from tiny_llm_base import PromptSpec

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

    def add(self, prompt, tokens, text, ttft: float, cached: int) -> None:
        """One request of mlx-lm's (mlx_lm_cached) counted."""
        self.ttft.append(ttft)
        self.tokens.append(tokens)
        self.prompt_tokens += len(prompt)
        self.computed_tokens += len(prompt) - cached
        self.cached_tokens += cached

    def record(self) -> dict:
        return dict(
            asdict(self),
            hit_rate=self.hit_rate,
            ttft_p50=self.percentile(50),
            ttft_p99=self.percentile(99),
        )


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


def make_engine(model, tokenizer, max_seq_len: int, caching: bool):
    return paged_engine(
        model,
        tokenizer,
        batch_size=BATCH_SIZE,
        max_seq_len=max_seq_len,
        block_size=BLOCK_SIZE,
        prefix_caching=caching,
    )


def run_engine(model, tokenizer, prompts, arrivals, max_tokens, caching) -> Result:
    """All prompts through one paged Engine, each admitted at its arrival step."""
    max_seq_len = max(len(p) for p in prompts) + max_tokens
    engine = make_engine(model, tokenizer, max_seq_len, caching)
    start = time.perf_counter()
    specs = [
        PromptSpec(p, max_tokens=max_tokens, arrival_step=a)
        for p, a in zip(prompts, arrivals)
    ]
    results = run_to_end(engine, specs)
    return summarize(caching, results, engine.metrics, time.perf_counter() - start)


def summarize(caching: bool, results, metrics, seconds: float) -> Result:
    """Our run's Result from its results and the engine's metrics."""
    return Result(
        f"ours, caching {'on' if caching else 'off'}",
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
    engine = make_engine(model, tokenizer, 2048, caching)
    results = []

    def answer(prompt: list[int]) -> str:
        results.extend(run_to_end(engine, [PromptSpec(prompt, max_tokens=max_tokens)]))
        return results[-1].text

    start = time.perf_counter()
    replay_chat(tokenizer, turns, answer)
    return summarize(caching, results, engine.metrics, time.perf_counter() - start)


def run_mlx_lm(peer, tokenizer, prompts, max_tokens) -> Result:
    result, lru = Result("mlx-lm, LRUPromptCache"), LRUPromptCache()
    start = time.perf_counter()
    for prompt in prompts:
        result.add(prompt, *mlx_lm_cached(peer, tokenizer, lru, prompt, max_tokens))
    result.seconds = time.perf_counter() - start
    return result


def run_chat_mlx_lm(peer, tokenizer, turns, max_tokens) -> Result:
    result, lru = Result("mlx-lm, LRUPromptCache"), LRUPromptCache()

    def answer(prompt: list[int]) -> str:
        reply = mlx_lm_cached(peer, tokenizer, lru, prompt, max_tokens)
        result.add(prompt, *reply)
        return reply[1]

    start = time.perf_counter()
    replay_chat(tokenizer, turns, answer)
    result.seconds = time.perf_counter() - start
    return result


def goals(a: list[Result], shareable: int) -> list:
    off, on = a[0], a[1]
    same = sum(x == y for x, y in zip(on.tokens, off.tokens))
    return [
        at_least(
            "TTFT p50, caching off / on (a)",
            off.percentile(50) / on.percentile(50),
            5,
            f"{on.percentile(50):.2f} s with caching vs {off.percentile(50):.2f} s",
        ),
        at_least(
            "hit rate: cached / shareable tokens (a)",
            on.cached_tokens / shareable,
            0.9,
            f"{on.cached_tokens} of {shareable} tokens",
        ),
        at_most(
            "peak KV memory / the dense preallocation (a)",
            on.peak_kv_tokens / on.dense_kv_tokens,
            0.5,
            f"{on.peak_kv_tokens} of {on.dense_kv_tokens} positions",
        ),
        identical(
            "output tokens identical with caching on and off (a)", same, len(on.tokens)
        ),
    ]


def table(title: str, results: list[Result]):
    columns = [
        "runner", "TTFT p50", "TTFT p99", "prompt tokens", "computed", "hit rate",
        "peak KV / dense", "total",
    ]  # fmt: skip
    rows = [
        [
            r.runner, f"{r.percentile(50):.2f} s", f"{r.percentile(99):.2f} s",
            str(r.prompt_tokens), str(r.computed_tokens), f"{100 * r.hit_rate:.0f}%",
            "-" if r.peak_kv_tokens is None
            else f"{r.peak_kv_tokens} / {r.dense_kv_tokens} positions",
            f"{r.seconds:.1f} s",
        ]
        for r in results
    ]  # fmt: skip
    return render.grid(title, columns, rows)


def main() -> int:
    bench = Bench(__doc__, quick=True, out="bench-results/prefix_cache.json")
    args = bench.parse()
    console = bench.start()
    models = bench.models()
    model, reference, tokenizer = models.float32, models.peer, models.tokenizer
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
    case_a.append(run_mlx_lm(reference, tokenizer, prompts, max_tokens))
    turns = CHAT_TURNS
    case_b = [
        run_chat_engine(model, tokenizer, turns, 24, caching)
        for caching in (False, True)
    ]
    case_b.append(run_chat_mlx_lm(reference, tokenizer, turns, 24))
    console.print(
        table(
            f"a: {requests} requests, {len(prompts[0])}-token prompts sharing {shared}",
            case_a,
        )
    )
    console.print(table(f"b: a {len(turns)}-turn chat, resent whole each turn", case_b))
    image = bench.image("week3-03-prefix-cache.png")
    cases = {"a: shared system prompt": case_a, "b: multi-turn chat": case_b}
    plots.plot_prefix_cache(cases, image)
    record = dict(
        quick=args.quick,
        batch_size=BATCH_SIZE,
        block_size=BLOCK_SIZE,
        shared_tokens=shared,
        shareable_tokens=shareable,
        cases={"a": case_a, "b": case_b},
    )
    return bench.finish(record, goals(case_a, shareable), [image])


if __name__ == "__main__":
    run_benchmark(main)
