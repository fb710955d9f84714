"""What a caller hands the scheduler (PromptSpec) and what it gets back
(GenerationResult), with the helpers both sides share."""

from collections.abc import Callable
from dataclasses import dataclass

import mlx.core as mx

Sampler = Callable[[mx.array], mx.array]
PRIORITIES = ("interactive", "batch")


def greedy(logprobs: mx.array) -> mx.array:
    """logprobs: [B, V] -> token ids [B]: the most likely token of each row."""
    return mx.argmax(logprobs, axis=-1)


@dataclass
class PromptSpec:
    """A prompt with its own settings.

    prompt: text (chat-templated as one user turn) or a list of token ids.
    max_tokens, sampler: override batch_generate's defaults for this prompt (None:
    use them). priority: "interactive" or "batch". arrival_step: the scheduler
    iteration at which the request arrives (0: at once).
    """

    prompt: str | list[int]
    max_tokens: int | None = None
    sampler: Sampler | None = None
    priority: str = "batch"
    arrival_step: int = 0


@dataclass
class GenerationResult:
    """What batch_generate returns per prompt, in prompt order.

    text: the detokenized generated text; tokens: the generated ids, an EOS left out.
    finish_reason: "stop" (EOS), "length" (max_tokens), "max_seq_len" (the cache is
    full) or "error" (then `error` says why and the other requests are unaffected).
    metrics: the request's RequestMetrics. prompt, priority: as given.
    """

    text: str
    tokens: list[int]
    finish_reason: str
    metrics: object
    error: str | None = None
    prompt: str | list[int] = ""
    priority: str = "batch"


def prompt_token_ids(tokenizer, prompt: str | list[int]) -> list[int]:
    """Token ids of a prompt: text goes through the chat template as one user turn.

    Raises ValueError for a blank text or an empty list of ids.
    """
    if isinstance(prompt, str):
        if not prompt.strip():
            raise ValueError("the prompt is empty: give the model something to answer")
        messages = [{"role": "user", "content": prompt}]
        return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True))
    if len(prompt) == 0:
        raise ValueError("the prompt has no tokens")
    return list(prompt)
