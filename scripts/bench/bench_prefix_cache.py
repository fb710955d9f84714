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
import functools
import time
from dataclasses import asdict, dataclass, field

from mlx_lm.server import LRUPromptCache

from scripts.bench.benchlib import plots
from scripts.bench.benchlib.course import run_benchmark
from scripts.bench.benchlib.harness import Bench, at_least, at_most, same_tokens
from scripts.bench.benchlib.prompt_texts import LIGHTHOUSE_TURNS
from scripts.bench.benchlib.runners import mlx_lm_cached, paged_engine, run_to_end
from scripts.bench.benchlib.workloads import (
    common_prefix,
    replay_chat,
    shared_system_prompt,
)
from tiny_llm_base import PromptSpec

BATCH_SIZE = 4
BLOCK_SIZE = 16


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


def ours(model, tokenizer, caching: bool, max_seq_len: int, send) -> Result:
    """Our paged Engine on what send(engine) sends it (their results, in order)."""
    engine = paged_engine(
        model, tokenizer, batch_size=BATCH_SIZE, max_seq_len=max_seq_len,
        block_size=BLOCK_SIZE, prefix_caching=caching,
    )  # fmt: skip
    start = time.perf_counter()
    results = send(engine)
    metrics = engine.metrics
    return Result(
        f"ours, caching {'on' if caching else 'off'}",
        [r.metrics.time_to_first_token for r in results],
        [r.tokens for r in results],
        sum(r.metrics.prompt_tokens for r in results),
        metrics.prefill_tokens,
        metrics.prefix_cached_tokens,
        metrics.kv_peak_tokens,
        metrics.kv_dense_tokens,
        time.perf_counter() - start,
    )


def at_steps(prompts: list, arrivals: list[int], max_tokens: int):
    """What ours() sends: the prompts, each added at its arrival step."""
    specs = [
        PromptSpec(p, max_tokens=max_tokens, arrival_step=a)
        for p, a in zip(prompts, arrivals)
    ]
    return lambda engine: run_to_end(engine, specs)


def chat_through(engine, tokenizer, turns: list[str], max_tokens: int) -> list:
    """A chat through the engine, each turn sent once the previous one is answered."""
    results = []

    def answer(prompt: list[int]) -> str:
        results.extend(run_to_end(engine, [PromptSpec(prompt, max_tokens=max_tokens)]))
        return results[-1].text

    replay_chat(tokenizer, turns, answer)
    return results


def mlx_lm(peer, tokenizer, max_tokens: int, send) -> Result:
    """mlx-lm alone with its server's LRUPromptCache; send(answer) sends the
    workload one request after another, answer(prompt) returning the reply's text."""
    result, lru = Result("mlx-lm, LRUPromptCache"), LRUPromptCache()

    def answer(prompt: list[int]) -> str:
        reply = mlx_lm_cached(peer, tokenizer, lru, prompt, max_tokens)
        result.add(prompt, *reply)
        return reply[1]

    start = time.perf_counter()
    send(answer)
    result.seconds = time.perf_counter() - start
    return result


def goals(a: list[Result], shareable: int) -> list:
    off, on = a[0], a[1]
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
        same_tokens(
            "output tokens identical with caching on and off (a)", on.tokens, off.tokens
        ),
    ]


COLUMNS = {
    "runner": lambda r: r.runner,
    "TTFT p50": lambda r: f"{r.percentile(50):.2f} s",
    "TTFT p99": lambda r: f"{r.percentile(99):.2f} s",
    "prompt tokens": lambda r: str(r.prompt_tokens),
    "computed": lambda r: str(r.computed_tokens),
    "hit rate": lambda r: f"{r.hit_rate:.0%}",
    "peak KV / dense": lambda r: (
        "-"
        if r.peak_kv_tokens is None
        else f"{r.peak_kv_tokens} / {r.dense_kv_tokens} positions"
    ),
    "total": lambda r: f"{r.seconds:.1f} s",
}


def main() -> int:
    bench = Bench(__doc__, quick=True, out="bench-results/prefix_cache.json")
    args = bench.parse()
    bench.start()
    models = bench.models()
    model, peer, tokenizer = models.float32, models.peer, models.tokenizer
    system_tokens, requests, max_tokens = (600, 8, 6) if args.quick else (1500, 16, 8)
    prompts = shared_system_prompt(tokenizer, system_tokens, requests)
    shared = min(common_prefix(prompts[0], p) for p in prompts[1:])
    shareable = (requests - 1) * (shared // BLOCK_SIZE * BLOCK_SIZE)
    # The first prefills alone (512-token chunks); the others arrive a step apart.
    first_done = -(-len(prompts[0]) // 512) + 1
    arrivals = [0] + [first_done + i for i in range(requests - 1)]
    longest = max(map(len, prompts)) + max_tokens
    ours(model, tokenizer, True, longest, at_steps(prompts[:2], [0, 0], 2))  # warm-up
    a = at_steps(prompts, arrivals, max_tokens)
    case_a = [ours(model, tokenizer, on, longest, a) for on in (False, True)]
    case_a.append(
        mlx_lm(peer, tokenizer, max_tokens, lambda ask: list(map(ask, prompts)))
    )
    turns = LIGHTHOUSE_TURNS[:4]
    b = functools.partial(chat_through, tokenizer=tokenizer, turns=turns, max_tokens=24)
    case_b = [ours(model, tokenizer, on, 2048, b) for on in (False, True)]
    case_b.append(
        mlx_lm(peer, tokenizer, 24, lambda ask: replay_chat(tokenizer, turns, ask))
    )
    title = f"a: {requests} requests, {len(prompts[0])}-token prompts sharing {shared}"
    bench.table(title, COLUMNS, case_a)
    bench.table(f"b: a {len(turns)}-turn chat, resent whole each turn", COLUMNS, case_b)
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
