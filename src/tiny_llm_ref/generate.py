"""Generating text: with the week-1 model the whole sequence goes through it each
step; with the week-2 model and its KV cache, only the new token does."""

from collections.abc import Callable

import mlx.core as mx

from .qwen2_week1 import Qwen2ModelWeek1
from .qwen2_week2 import Qwen2ModelWeek2
from .sampler import Sampler


def simple_generate(
    model: Qwen2ModelWeek1,
    tokenizer,
    prompt: str,
    sampler: Sampler | None = None,
    max_tokens: int = 256,
    on_text: Callable[[str], None] | None = None,
) -> str:
    """Answer `prompt` (one user message, chat-templated); return the generated text.

    Each step runs the full sequence (prompt plus tokens so far) through the model
    and samples from the last position's logits: simple, but the work grows
    quadratically with length, which week 2's KV cache removes. Stops at an
    end-of-sequence token or after max_tokens tokens. sampler defaults to greedy.
    on_text(segment) is called with each newly readable piece of text; the pieces
    concatenate to the returned string.
    """
    # Week 1 Day 6 Task 1: simple_generate (the generation loop)

    def next_logits(tokens: list[int]) -> mx.array:
        return model(mx.array(tokens)[None])[:, -1, :]

    return generate_text(next_logits, tokenizer, prompt, sampler, max_tokens, on_text)


def simple_generate_with_kv_cache(
    model: Qwen2ModelWeek2,
    tokenizer,
    prompt: str,
    sampler: Sampler | None = None,
    max_tokens: int = 256,
    on_text: Callable[[str], None] | None = None,
) -> str:
    """simple_generate with a KV cache: each step feeds the model only its new tokens.

    The first step runs the whole chat-templated prompt at offset 0 (the prefill) and
    fills one cache per layer; every later step runs the one token just sampled, at
    offset = the number of tokens already in the cache. A step's work no longer
    grows with the length of the sequence, only its attention does. Same arguments,
    stopping rule and streaming as simple_generate.
    """
    # Week 2 Day 1 Task 3: simple_generate_with_kv_cache: like simple_generate, but
    # create the model's KV cache once, run the prompt at offset 0, then feed only the
    # last sampled token at offset = the tokens already cached
    cache = model.create_kv_cache()
    offset = 0  # tokens already in the cache

    def next_logits(tokens: list[int]) -> mx.array:
        nonlocal offset
        logits = model(mx.array(tokens[offset:])[None], offset, cache)[:, -1, :]
        offset = len(tokens)
        return logits

    return generate_text(next_logits, tokenizer, prompt, sampler, max_tokens, on_text)


def generate_text(
    next_logits: Callable[[list[int]], mx.array],
    tokenizer,
    prompt: str,
    sampler: Sampler | None,
    max_tokens: int,
    on_text: Callable[[str], None] | None,
) -> str:
    """The loop both generators share; next_logits(all tokens so far) -> logits [1, V]."""
    # Week 1 Day 6 Task 1: generate_text: chat-template the prompt, then loop:
    # next_logits(tokens) -> logprobs -> sampler; stop at EOS or max_tokens; stream
    # readable text through the detokenizer to on_text
    sampler = sampler or greedy
    tokens = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True
    )
    detokenizer = tokenizer.detokenizer  # a fresh streaming detokenizer
    pieces = []

    def emit(segment: str) -> None:
        if segment:
            pieces.append(segment)
            if on_text is not None:
                on_text(segment)

    for _ in range(max_tokens):
        logits = next_logits(tokens)
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        token = sampler(logprobs).item()
        if token in tokenizer.eos_token_ids:
            break
        tokens.append(token)
        detokenizer.add_token(token)
        emit(detokenizer.last_segment)
    detokenizer.finalize()
    emit(detokenizer.last_segment)
    return "".join(pieces)


def greedy(logprobs: mx.array) -> mx.array:
    """The most likely token of each row: make_sampler(0.0)'s choice, without
    needing Week 1 Day 7."""
    return mx.argmax(logprobs, axis=-1)
