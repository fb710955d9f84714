"""The prefix cache's disk tier measured: a coding agent's session across a restart.

pdm run bench-kv-disk            # 10 turns, a restart between turns 5 and 6
pdm run bench-kv-disk --quick    # 4 turns of shorter files, a restart after turn 2

A coding agent replayed: each turn a read_file tool result (~600 tokens of this
repository's source) after the conversation so far, resent whole, and a greedy
answer of up to 32 tokens; by turn 10 the prompt is ~6,500 tokens of the embedded
model's 8,192. One Engine (paged, prefix caching, the disk tier in a temporary
folder) runs the turns; after turn 5 it is closed (its named blocks go to disk)
and a new Engine on the same folder, with an empty pool, runs the rest. Then a
fresh Engine with no cache runs turn 6's prompt: its tokens must be turn 6's, and
its prefill is what recomputing the conversation costs.

Goals: turn 6's TTFT (the first after the restart) at most 1.5x turn 5's; turn 6's
tokens identical to the fresh engine's; turn 6 found at least 90% of the tokens it
shares with turn 5 (whole blocks) on disk; a block read from disk (read, checked,
written into the pool) at least 2x faster than computed.
"""

from scripts.commands.interrupt import exit_on_interrupt

exit_on_interrupt()  # first: Ctrl-C during the imports below never shows a traceback

import tiny_llm_base  # noqa: F401  (first: the fast BLAS before mlx.core)

# isort: split
import tempfile
from dataclasses import asdict, dataclass

from scripts.bench.benchlib.course import run_benchmark
from scripts.bench.benchlib.harness import Bench, clocked
from scripts.bench.benchlib.goals import at_least, at_most, identical
from scripts.bench.benchlib.runners import paged_engine, run_to_end
from scripts.bench.benchlib.chats import Reply, engine_replies, replay, reusable
from scripts.bench.benchlib.workloads import agent_session
from tiny_llm_base import PromptSpec
from tiny_llm_base.mlx_lm_reference import chat_ids

BLOCK_SIZE = 16
MAX_TOKENS = 32


@dataclass
class Turn:
    """One turn: its prompt, where its cached tokens came from, its TTFT."""

    number: int
    prompt_tokens: int
    cached_tokens: int
    from_disk: int
    ttft: float
    tokens: list[int]
    engine: int  # 1 before the restart, 2 after; 0 a fresh engine with no cache

    def label(self, restart_after: int) -> str:
        if self.engine == 0:
            return f"{self.number}, a fresh engine with no cache"
        after = self.number == restart_after + 1
        return f"{self.number}{' (after the restart)' if after else ''}"


COLUMNS = {
    "prompt": lambda t: f"{t.prompt_tokens:,}",
    "from memory": lambda t: f"{t.cached_tokens - t.from_disk:,}",
    "from disk": lambda t: f"{t.from_disk:,}",
    "computed": lambda t: f"{t.prompt_tokens - t.cached_tokens:,}",
    "TTFT": lambda t: f"{t.ttft:.2f} s",
}


def make_engine(model, tokenizer, **settings):
    """A paged Engine with room for the whole session: a disk tier with
    kv_disk_dir, none with prefix_caching=False."""
    return paged_engine(
        model,
        tokenizer,
        batch_size=2,
        max_seq_len=8192,
        max_tokens=MAX_TOKENS,
        block_size=BLOCK_SIZE,
        **settings,
    )


def session(model, tokenizer, system, messages, restart_after, folder) -> dict:
    """The session's turns, the engine closed and made again after restart_after
    turns; the prompts, the turns and what the restart cost."""
    engines = [make_engine(model, tokenizer, kv_disk_dir=folder)]
    turns, restart = [], {}

    def answer(prompt: list[int]) -> Reply:
        if len(turns) == restart_after:
            _, restart["close_s"] = clocked(engines[-1].close)
            restart["blocks_written"] = engines[-1].kv.disk.blocks_written
            engine, restart["new_engine_s"] = clocked(
                make_engine, model, tokenizer, kv_disk_dir=folder
            )
            engines.append(engine)
        kv = engines[-1].kv
        loaded = kv.blocks_loaded
        r = engine_replies(engines[-1], MAX_TOKENS)(prompt)
        from_disk = (kv.blocks_loaded - loaded) * BLOCK_SIZE
        number, count = len(turns) + 1, len(engines)
        turns.append(
            Turn(number, len(prompt), r.cached, from_disk, r.ttft, r.tokens, count)
        )
        return r

    replies = replay(tokenizer, messages, answer, system)
    after = engines[-1].kv
    restart["load_s"], restart["blocks_loaded"] = (
        after.load_seconds,
        after.blocks_loaded,
    )
    restart["read_s"] = after.disk.read_seconds  # of load_s: files read and checked
    return dict(prompts=[r.prompt for r in replies], turns=turns, restart=restart)


def recompute(model, tokenizer, prompt: list[int], number: int) -> Turn:
    """Turn `number`'s prompt on a fresh engine with no cache."""
    engine = make_engine(model, tokenizer, prefix_caching=False)
    (result,) = run_to_end(engine, [PromptSpec(prompt)])
    ttft = result.metrics.time_to_first_token
    return Turn(number, len(prompt), 0, 0, ttft, result.tokens, engine=0)


def main() -> int:
    bench = Bench(__doc__, quick=True, out="bench-results/kv_disk.json")
    args = bench.parse()
    console = bench.start()
    models = bench.models()
    model, tokenizer = models.float32, models.tokenizer
    turns, restart_after, tool_tokens = (4, 2, 250) if args.quick else (10, 5, 600)
    system, messages = agent_session(tokenizer, turns, tool_tokens)
    with tempfile.TemporaryDirectory() as folder:
        warm = make_engine(model, tokenizer, kv_disk_dir=folder)  # compiles every path
        run_to_end(warm, [PromptSpec(chat_ids(tokenizer, "Hi"))])
    with tempfile.TemporaryDirectory() as folder:
        with console.status(f"{turns} turns, a restart after turn {restart_after}"):
            run = session(model, tokenizer, system, messages, restart_after, folder)
    before, after = run["turns"][restart_after - 1], run["turns"][restart_after]
    first_prompt = run["prompts"][restart_after]
    with console.status(f"turn {restart_after + 1} on a fresh engine, no cache"):
        fresh = recompute(model, tokenizer, first_prompt, restart_after + 1)
    columns = {"turn": lambda t: t.label(restart_after), **COLUMNS}
    title = (
        f"a {turns}-turn coding agent, ~{tool_tokens}-token tool results, "
        f"restarted after turn {restart_after}"
    )
    bench.table(title, columns, [*run["turns"], None, fresh])
    restart = run["restart"]
    read_ms = 1000 * restart["load_s"] / max(1, restart["blocks_loaded"])
    compute_ms = 1000 * fresh.ttft / (after.prompt_tokens / BLOCK_SIZE)
    console.print(
        f"restart: close wrote {restart['blocks_written']} blocks in "
        f"{restart['close_s']:.2f} s, the new engine took {restart['new_engine_s']:.2f}"
        f" s; turn {restart_after + 1} loaded {restart['blocks_loaded']} blocks in "
        f"{restart['load_s']:.2f} s"
    )
    file_ms = 1000 * restart["read_s"] / max(1, restart["blocks_loaded"])
    console.print(
        f"a block of {BLOCK_SIZE} tokens: {read_ms:.2f} ms from disk ({file_ms:.2f} ms "
        f"its file read and checked, the rest written into the pool) vs "
        f"{compute_ms:.1f} ms computed (the fresh engine's prefill of turn "
        f"{restart_after + 1} over its blocks)"
    )
    previous = run["prompts"][restart_after - 1]
    shareable = (
        reusable(first_prompt, previous, before.tokens) // BLOCK_SIZE * BLOCK_SIZE
    )
    goals = [
        at_most(
            f"TTFT turn {restart_after + 1} (after the restart) / turn {restart_after}",
            after.ttft / before.ttft,
            1.5,
            f"{after.ttft:.2f} s vs {before.ttft:.2f} s; the fresh engine "
            f"{fresh.ttft:.2f} s",
        ),
        identical(
            f"turn {restart_after + 1}'s tokens, disk tier vs a fresh engine",
            int(after.tokens == fresh.tokens),
            1,
        ),
        at_least(
            f"turn {restart_after + 1}: tokens found on disk / shared with turn "
            f"{restart_after}",
            after.from_disk / shareable,
            0.9,
            f"{after.from_disk} of {shareable}",
        ),
        at_least(
            "a block computed / read from disk",
            compute_ms / read_ms,
            2,
            f"{compute_ms:.1f} ms vs {read_ms:.2f} ms",
        ),
    ]
    record = dict(
        quick=args.quick,
        turns=[asdict(t) for t in run["turns"]],
        restart_after=restart_after,
        restart=restart,
        fresh=dict(ttft=fresh.ttft, tokens=fresh.tokens),
        block_read_ms=read_ms,
        block_compute_ms=compute_ms,
    )
    return bench.finish(record, goals)


if __name__ == "__main__":
    run_benchmark(main)
