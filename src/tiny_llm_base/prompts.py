"""What a caller hands batch_generate (PromptSpec) and what it gets back for each
prompt (GenerationResult), with the helpers both sides share: the default sampler and
a prompt's token ids."""

from collections.abc import Callable
from dataclasses import dataclass

import mlx.core as mx

# A sampler maps log-probabilities [B, V] to token ids [B]; a request calls its own
# with its one row, [1, V].
Sampler = Callable[[mx.array], mx.array]
PRIORITIES = ("interactive", "batch")


def greedy(logprobs: mx.array) -> mx.array:
    """logprobs: [B, V] -> token ids [B]: the most likely token of each row."""
    return mx.argmax(logprobs, axis=-1)


@dataclass
class PromptSpec:
    """A prompt with its own settings. batch_generate also takes a plain text or list
    of token ids: that is PromptSpec(prompt), every setting at its default.

    prompt: text, chat-templated as one user turn, or token ids used as they are (see
        prompt_token_ids).
    max_tokens: the most tokens to generate for this prompt. None: batch_generate's
        max_tokens (if that is None too: until EOS or a full cache). Below 1: this
        request alone fails (finish_reason "error").
    sampler: log-probabilities [1, V] -> token id [1] for this prompt alone. None:
        batch_generate's sampler, or greedy if that is None too.
    priority: "batch" or "interactive". An interactive request's prefill chunks go
        first, and it may take any free decode slot, while batch requests together
        hold at most batch_size - reserved_interactive_slots of them. Anything else:
        this request alone fails.
    arrival_step: how many scheduler iterations must be done before the request is
        admitted: 0 joins the first iteration, s joins the iteration whose
        SchedulerSnapshot.step is s + 1 (empty iterations run until then if nothing
        else is left). Below 0: batch_generate raises ValueError.
    """

    prompt: str | list[int]
    max_tokens: int | None = None
    sampler: Sampler | None = None
    priority: str = "batch"
    arrival_step: int = 0


@dataclass
class GenerationResult:
    """What batch_generate returns for one prompt; the results come in prompt order.

    text: the generated text, detokenized ("" when nothing was generated).
    tokens: the generated token ids; the EOS that ends a request is never among them.
    finish_reason: "stop" (the model sampled EOS), "length" (max_tokens tokens),
        "max_seq_len" (the cache is full: the request's offset reached max_seq_len), or
        "error" (this request alone failed; `error` says why, the others ran on).
    metrics: the request's RequestMetrics, times on batch_generate's clock.
    error: why the request failed, else None.
    prompt, priority: as given (a plain prompt has priority "batch").
    """

    text: str
    tokens: list[int]
    finish_reason: str
    metrics: object
    error: str | None = None
    prompt: str | list[int] = ""
    priority: str = "batch"


def prompt_token_ids(tokenizer, prompt: str | list[int]) -> list[int]:
    """Token ids of a prompt: a text goes through the tokenizer's chat template as one
    user turn, with the assistant's turn opened after it; a list of ids is copied.

    Raises ValueError("the prompt is empty: give the model something to answer") for
    a text that is empty or only whitespace, and ValueError("the prompt has no
    tokens") for an empty list. Request catches it: that request fails with the
    message as its error, and batch_generate runs the others.
    """
    if isinstance(prompt, str):
        if not prompt.strip():
            raise ValueError("the prompt is empty: give the model something to answer")
        messages = [{"role": "user", "content": prompt}]
        return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True))
    if len(prompt) == 0:
        raise ValueError("the prompt has no tokens")
    return list(prompt)
