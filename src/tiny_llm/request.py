"""One generation request, from its prompt to its finish reason.

Progress is counters: `offset` (tokens already in the request's KV cache: prompt
tokens while it prefills, then one more per decode step) and the generated tokens.
`is_prefill_done` is derived from them, never stored.
Prefill runs in chunks: each `try_prefill` call pushes at most `prefill_max_step`
prompt tokens through the model, starting at `offset`, and the last chunk samples
the first generated token.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import mlx.core as mx

# Infrastructure, not course material: given by tiny_llm_base.
from tiny_llm_base import (  # noqa: F401
    PRIORITIES,
    GenerationResult,
    PromptSpec,
    Sampler,
    greedy,
    prompt_token_ids,
)

from .kv_cache import TinyKvCache
from .metrics import RequestMetrics


@dataclass(eq=False)
class Request:
    """A prompt being prefilled (offset < prompt length), decoded, or finished.

    kv_cache: the request's own cache while it prefills; a decode slot copies it into
    the batch cache. next_token: the last sampled token, not yet in any cache.
    """

    model: object
    tokenizer: object
    prompt: str | list[int]
    prefill_max_step: int | None = 128
    max_tokens: int | None = None
    max_seq_len: int | None = None
    sampler: Sampler = greedy
    priority: str = "batch"
    clock: Callable[[], float] = time.perf_counter
    prefill_tokens: list[int] = field(init=False)
    offset: int = field(init=False, default=0)
    next_token: int | None = field(init=False, default=None)
    generated: list[int] = field(init=False, default_factory=list)
    finish_reason: str | None = field(init=False, default=None)
    error: str | None = field(init=False, default=None)
    metrics: RequestMetrics = field(init=False, default_factory=RequestMetrics)
    detokenizer: object = field(init=False, default=None)
    kv_cache: list[TinyKvCache] | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        raise NotImplementedError(
            "Week 2 Day 6: Request: raise ValueError for prefill_max_step < 1; a bad "
            "priority, max_tokens < 1, an empty prompt (see prompt_token_ids) or one "
            "longer than max_seq_len fails this request alone (fail(), no raise); "
            "otherwise keep the prompt's token ids, create the model's KV cache, take "
            "tokenizer.detokenizer and record the prompt length in metrics"
        )

    @property
    def is_prefill_done(self) -> bool:
        raise NotImplementedError(
            "Week 2 Day 6: is_prefill_done: offset has reached the prompt length"
        )

    @property
    def is_finished(self) -> bool:
        raise NotImplementedError(
            "Week 2 Day 6: is_finished: the request has a finish_reason"
        )

    @property
    def text(self) -> str:
        raise NotImplementedError(
            "Week 2 Day 6: text: the detokenizer's text ('' without a detokenizer)"
        )

    def try_prefill(self, max_step: int | None = None) -> int:
        """Prefill the next chunk; return how many prompt tokens it processed.

        The chunk starts at `offset` and has at most `max_step` tokens (default:
        prefill_max_step; None means the whole rest). Its queries see the cached
        earlier chunks through the chunk mask. The cache is evaluated here, so the
        lazy graph never spans chunks. The last chunk samples the first token.
        """
        raise NotImplementedError(
            "Week 2 Day 7: try_prefill: ValueError once prefill is done; run "
            "prefill_tokens[offset : offset + step] through the model at `offset` "
            "with this request's cache, advance offset, evaluate the cache, and on "
            "the last chunk sample and accept the first token (Day 6 only needs the "
            "whole prompt in one call)"
        )

    def sample(self, logits: mx.array) -> mx.array:
        """logits: [1, V] -> token [1], through this request's sampler."""
        raise NotImplementedError(
            "Week 2 Day 6: sample: turn logits into log-probabilities "
            "(subtract logsumexp) and call the sampler"
        )

    def accept(self, token: int) -> None:
        """Take a sampled token: finish on EOS, max_tokens, or a full cache."""
        raise NotImplementedError(
            "Week 2 Day 6: accept: EOS finishes with 'stop' (the token is not kept); "
            "otherwise keep it, feed the detokenizer, make it next_token, and finish "
            "with 'length' at max_tokens or 'max_seq_len' when offset reaches it"
        )

    def finish(self, reason: str) -> None:
        raise NotImplementedError(
            "Week 2 Day 6: finish: set finish_reason, drop next_token and the cache, "
            "finalize the detokenizer"
        )

    def fail(self, message: str) -> None:
        raise NotImplementedError(
            "Week 2 Day 6: fail: keep the error message and finish with 'error'"
        )

    def result(self) -> GenerationResult:
        raise NotImplementedError(
            "Week 2 Day 6: result: a GenerationResult of this request's text, "
            "tokens, finish reason, metrics, error, prompt and priority"
        )
