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

from scripts.commands.interrupt import exit_on_interrupt

exit_on_interrupt()  # first: Ctrl-C during the imports below never shows a traceback

import tiny_llm_base  # noqa: F401  (first: the fast BLAS before mlx.core)

# isort: split
from dataclasses import asdict, dataclass

from scripts.bench.benchlib import plots
from scripts.bench.benchlib.course import run_benchmark
from scripts.bench.benchlib.harness import Bench, clocked
from scripts.bench.benchlib.goals import at_least, at_most
from scripts.bench.benchlib.goals import same_tokens
from scripts.bench.benchlib.prompt_texts import LIGHTHOUSE_TURNS
from scripts.bench.benchlib.chats import Reply, common_prefix, engine_replies
from scripts.bench.benchlib.chats import mlx_lm_replies, replay
from scripts.bench.benchlib.runners import paged_engine, run_to_end
from scripts.bench.benchlib.workloads import shared_system_prompt
from tiny_llm_base import PromptSpec

BATCH_SIZE = 4
BLOCK_SIZE = 16


@dataclass
class Result:
    """One run of a workload: per-request TTFT and tokens, and the run's counts."""

    runner: str
    ttft: list[float]
    tokens: list[list[int]]
    prompt_tokens: int
    computed_tokens: int
    cached_tokens: int
    seconds: float
    peak_kv_tokens: int | None = None  # ours only
    dense_kv_tokens: int | None = None

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def percentile(self, q: float) -> float:
        ordered = sorted(self.ttft)
        return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]

    @classmethod
    def of(cls, runner: str, replies: list[Reply], seconds: float, metrics=None):
        """A run's Result from its replies; metrics: our engine's, which counts the
        tokens it computed and found cached, and the KV cache's peak."""
        prompt = sum(len(r.prompt) for r in replies)
        cached = sum(r.cached for r in replies)
        ttft, tokens = [r.ttft for r in replies], [r.tokens for r in replies]
        if metrics is None:
            return cls(runner, ttft, tokens, prompt, prompt - cached, cached, seconds)
        computed, cached = metrics.prefill_tokens, metrics.prefix_cached_tokens
        kv = metrics.kv_peak_tokens, metrics.kv_dense_tokens
        return cls(runner, ttft, tokens, prompt, computed, cached, seconds, *kv)

    def record(self) -> dict:
        return dict(
            asdict(self),
            hit_rate=self.hit_rate,
            ttft_p50=self.percentile(50),
            ttft_p99=self.percentile(99),
        )


def ours(model, tokenizer, caching: bool, max_seq_len: int, send) -> Result:
    """Our paged Engine on what send(engine) sends it, its replies in order."""
    engine = paged_engine(
        model, tokenizer, batch_size=BATCH_SIZE, max_seq_len=max_seq_len,
        block_size=BLOCK_SIZE, prefix_caching=caching,
    )  # fmt: skip
    replies, seconds = clocked(send, engine)
    name = f"ours, caching {'on' if caching else 'off'}"
    return Result.of(name, replies, seconds, engine.metrics)


def mlx_lm(peer, tokenizer, max_tokens: int, send) -> Result:
    """mlx-lm alone with its server's LRUPromptCache, one request after another:
    send(answer) sends the workload, answer(prompt) -> Reply."""
    answer = mlx_lm_replies(peer, tokenizer, max_tokens)
    replies, seconds = clocked(send, answer)
    return Result.of("mlx-lm, LRUPromptCache", replies, seconds)


def at_steps(prompts: list, arrivals: list[int], max_tokens: int):
    """What ours() sends: the prompts, each added at its arrival step."""
    specs = [
        PromptSpec(p, max_tokens=max_tokens, arrival_step=a)
        for p, a in zip(prompts, arrivals)
    ]
    return lambda engine: list(map(Reply.of, prompts, run_to_end(engine, specs)))


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

    def b(engine):  # the chat, each turn once the one before is answered
        return replay(tokenizer, turns, engine_replies(engine, 24))

    case_b = [ours(model, tokenizer, on, 2048, b) for on in (False, True)]
    case_b.append(
        mlx_lm(peer, tokenizer, 24, lambda ask: replay(tokenizer, turns, ask))
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
