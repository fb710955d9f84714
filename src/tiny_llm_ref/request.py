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

from tiny_llm_base import (
    PRIORITIES,
    GenerationResult,
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
        if self.prefill_max_step is not None and self.prefill_max_step < 1:
            raise ValueError(
                f"prefill_max_step must be at least 1 (or None), got {self.prefill_max_step}"
            )
        self.prefill_tokens = []
        if self.priority not in PRIORITIES:
            self.fail(f"priority must be one of {PRIORITIES}, got {self.priority!r}")
            return
        if self.max_tokens is not None and self.max_tokens < 1:
            self.fail(f"max_tokens must be at least 1 (or None), got {self.max_tokens}")
            return
        try:
            self.prefill_tokens = prompt_token_ids(self.tokenizer, self.prompt)
        except ValueError as error:
            self.fail(str(error))
            return
        if self.max_seq_len is not None and len(self.prefill_tokens) > self.max_seq_len:
            self.fail(
                f"the prompt has {len(self.prefill_tokens)} tokens but max_seq_len is "
                f"{self.max_seq_len}: raise max_seq_len or shorten the prompt"
            )
            return
        self.kv_cache = self.model.create_kv_cache()
        self.detokenizer = self.tokenizer.detokenizer
        self.metrics.prompt_tokens = len(self.prefill_tokens)

    @property
    def is_prefill_done(self) -> bool:
        return self.offset >= len(self.prefill_tokens)

    @property
    def is_finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def text(self) -> str:
        return self.detokenizer.text if self.detokenizer else ""

    def try_prefill(self, max_step: int | None = None) -> int:
        """Prefill the next chunk; return how many prompt tokens it processed.

        The chunk starts at `offset` and has at most `max_step` tokens (default:
        prefill_max_step; None means the whole rest). Its queries see the cached
        earlier chunks through the chunk mask. The cache is evaluated here, so the
        lazy graph never spans chunks. The last chunk samples the first token.
        """
        if self.is_prefill_done:
            raise ValueError("prefill is already done: this request is decoding")
        step = max_step if max_step is not None else self.prefill_max_step
        end = (
            len(self.prefill_tokens)
            if step is None
            else min(self.offset + step, len(self.prefill_tokens))
        )
        chunk = mx.array([self.prefill_tokens[self.offset : end]])
        logits = self.model(chunk, self.offset, self.kv_cache, last_position_only=True)
        processed, self.offset = end - self.offset, end
        cache_state = [c.keys for c in self.kv_cache] + [
            c.values for c in self.kv_cache
        ]
        if not self.is_prefill_done:
            mx.eval(*cache_state)
            return processed
        token = self.sample(logits[:, -1, :])
        mx.eval(token, *cache_state)
        self.accept(token.item())
        return processed

    def sample(self, logits: mx.array) -> mx.array:
        """logits: [1, V] -> token [1], through this request's sampler."""
        return self.sampler(logits - mx.logsumexp(logits, axis=-1, keepdims=True))

    def accept(self, token: int) -> None:
        """Take a sampled token: finish on EOS, max_tokens, or a full cache."""
        self.metrics.record_token(self.clock())
        if token in self.tokenizer.eos_token_ids:
            self.finish("stop")
            return
        self.generated.append(token)
        self.detokenizer.add_token(token)
        self.next_token = token
        if self.max_tokens is not None and len(self.generated) >= self.max_tokens:
            self.finish("length")
        elif self.max_seq_len is not None and self.offset >= self.max_seq_len:
            self.finish("max_seq_len")  # no room left in the cache to feed the token

    def finish(self, reason: str) -> None:
        self.finish_reason = reason
        self.next_token = None
        self.detokenizer.finalize()
        self.kv_cache = None

    def fail(self, message: str) -> None:
        self.error = message
        self.finish_reason = "error"

    def result(self) -> GenerationResult:
        return GenerationResult(
            self.text,
            list(self.generated),
            self.finish_reason,
            self.metrics,
            self.error,
            self.prompt,
            self.priority,
        )
