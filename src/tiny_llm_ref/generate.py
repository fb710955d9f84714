"""Generating text with the week-1 model: the whole sequence goes through it each step."""

from collections.abc import Callable

import mlx.core as mx

from .qwen2_week1 import Qwen2ModelWeek1
from .sampler import Sampler, make_sampler


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
    sampler = sampler or make_sampler(0.0)
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
        logits = model(mx.array(tokens)[None])[:, -1, :]
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
