"""Requests answered one after another, ours or mlx-lm's, each reply measured the
same way; and a chat replayed turn by turn, its prompt resent whole every turn as a
chat client does, so that a prefix cache can find what the previous turn computed.

    answer = engine_replies(engine, max_tokens=32)          # ours
    answer = mlx_lm_replies(peer, tokenizer, max_tokens=32) # mlx-lm, LRUPromptCache
    replies = replay(tokenizer, ["Hi.", "Why?"], answer)    # one Reply a turn
"""

import time
from collections.abc import Callable
from dataclasses import dataclass

import mlx.core as mx
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.server import LRUPromptCache

from tiny_llm_base import PromptSpec

from .runners import run_to_end
from .workloads import chat


@dataclass
class Reply:
    """One request answered: its prompt, the generated tokens and their text (EOS
    left out), the time to the first token (s) and the prompt tokens found cached."""

    prompt: list[int]
    tokens: list[int]
    text: str
    ttft: float
    cached: int

    @classmethod
    def of(cls, prompt: list[int], result) -> "Reply":
        """Our engine's result for `prompt`."""
        metrics = result.metrics
        return cls(
            prompt,
            result.tokens,
            result.text,
            metrics.time_to_first_token,
            metrics.cached_tokens,
        )


def engine_replies(engine, max_tokens: int) -> Callable[[list[int]], Reply]:
    """answer(prompt): the prompt run to its end on `engine` alone."""

    def answer(prompt: list[int]) -> Reply:
        spec = PromptSpec(prompt, max_tokens=max_tokens)
        return Reply.of(prompt, run_to_end(engine, [spec])[0])

    return answer


def mlx_lm_replies(peer, tokenizer, max_tokens: int) -> Callable[[list[int]], Reply]:
    """answer(prompt): mlx-lm alone (generate_step), from the nearest entry of its
    server's LRUPromptCache (one per answerer), stored back after it."""
    lru, eos = LRUPromptCache(), set(tokenizer.eos_token_ids)

    def answer(prompt: list[int]) -> Reply:
        start = time.perf_counter()
        cache, rest = lru.fetch_nearest_cache("model", prompt)
        if cache is None:
            cache = make_prompt_cache(peer)
        tokens, first = [], None
        for token, _ in generate_step(
            mx.array(rest), peer, max_tokens=max_tokens, prompt_cache=cache
        ):
            first = first or time.perf_counter()
            tokens.append(token)
        lru.insert_cache("model", (prompt + tokens)[: cache[0].offset], cache)
        text = tokenizer.decode([t for t in tokens if t not in eos])
        return Reply(prompt, tokens, text, first - start, len(prompt) - len(rest))

    return answer


def replay(
    tokenizer, questions: list[str], answer, system: str | None = None
) -> list[Reply]:
    """A chat: each question a user turn after the conversation so far (from the
    system prompt, if any), its reply the assistant's turn; answer(the whole
    conversation's ids) -> Reply."""
    messages = [{"role": "system", "content": system}] if system else []
    replies = []
    for question in questions:
        messages.append({"role": "user", "content": question})
        replies.append(answer(chat(tokenizer, messages)))
        messages.append({"role": "assistant", "content": replies[-1].text})
    return replies


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many tokens a and b share from their start."""
    return next(
        (i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b))
    )


def reusable(prompt: list[int], previous: list[int], answer: list[int]) -> int:
    """The tokens of `prompt` a cache can hold from the turn before (its prompt
    `previous` and its `answer`): their common prefix with what that turn computed
    (all but the answer's last token, sampled and never fed), never the prompt's
    last token (always computed, for its logits)."""
    return min(common_prefix(prompt, previous + answer[:-1]), len(prompt) - 1)
