"""One generation request, from its prompt to its finish reason.

Progress is counters: `offset` (tokens already in the request's KV cache: prompt
tokens while it prefills, then one more per decode step) and the generated tokens.
`is_prefill_done` is derived from them, never stored.
Prefill runs in chunks: each `try_prefill` call pushes at most `prefill_max_step`
prompt tokens through the model, starting at `offset`, and the last chunk samples
the first generated token.
A request checks itself when it is made: a bad prompt or setting fails it alone
(finish_reason "error") before it costs any compute, and so does anything that goes
wrong while it samples a token.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import mlx.core as mx

from tiny_llm_base import (
    PRIORITIES,
    GenerationResult,
    Sampler,
    check_int,
    greedy,
    prompt_token_ids,
    sampled_token_id,
)

from .kv_cache import TinyKvCache
from .metrics import RequestMetrics


@dataclass(eq=False)
class Request:
    """A prompt being prefilled (offset < prompt length), decoded, or finished.

    kv_cache: the request's own cache while it prefills; a decode slot copies it into
    the batch cache. next_token: the last sampled token, not yet in any cache.
    max_seq_len: the most positions its cache may hold, at most the model's
    context_length (None: context_length).
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
        check_int("prefill_max_step", self.prefill_max_step, 1, allow_none=True)
        context = self.model.context_length
        if self.max_seq_len is None:
            self.max_seq_len = context
        check_int("max_seq_len", self.max_seq_len, 1)
        if self.max_seq_len > context:
            raise ValueError(
                f"max_seq_len is {self.max_seq_len} but the model's context is "
                f"{context} positions: pass at most {context}"
            )
        self.prefill_tokens = []
        try:
            self.prefill_tokens = self._checked_prompt_ids()
        except (TypeError, ValueError) as error:
            self.fail(str(error))
            return
        self.kv_cache = self.model.create_kv_cache()
        self.detokenizer = self.tokenizer.detokenizer
        self.metrics.prompt_tokens = len(self.prefill_tokens)

    def _checked_prompt_ids(self) -> list[int]:
        """The prompt's token ids, once this request's settings hold up; raises
        TypeError or ValueError saying what to fix."""
        if self.priority not in PRIORITIES:
            raise ValueError(
                f"priority must be one of {PRIORITIES}, got {self.priority!r}"
            )
        check_int("max_tokens", self.max_tokens, 1, allow_none=True)
        if not callable(self.sampler):
            raise TypeError(
                "sampler must be callable (log-probabilities [1, V] -> token id [1]), "
                f"got {type(self.sampler).__name__}"
            )
        ids = prompt_token_ids(self.tokenizer, self.prompt, self.model.vocab_size)
        # Every prompt token and every generated token but the last takes a position.
        needed = len(ids) + (self.max_tokens or 1) - 1
        context = self.model.context_length
        if needed > context:
            raise ValueError(
                f"the prompt has {len(ids)} tokens and max_tokens is "
                f"{self.max_tokens}: that needs {needed} positions, more than the model's context of "
                f"{context}; shorten the prompt or lower max_tokens"
            )
        if len(ids) > self.max_seq_len:
            raise ValueError(
                f"the prompt has {len(ids)} tokens but max_seq_len is "
                f"{self.max_seq_len}: raise max_seq_len or shorten the prompt"
            )
        return ids

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
        check_int("max_step", max_step, 1, allow_none=True)
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
        mx.eval(*cache_state)
        if self.is_prefill_done:
            self.sample_and_accept(logits[:, -1, :])
        return processed

    def sample(self, logits: mx.array) -> int:
        """logits: [1, V] -> the next token id, through this request's sampler.

        Raises TypeError or ValueError when the sampler returns anything but one
        token id of the model's vocabulary (see sampled_token_id).
        """
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        return sampled_token_id(self.sampler(logprobs), self.model.vocab_size)

    def sample_and_accept(self, logits: mx.array) -> None:
        """logits: [1, V] at the request's last position: sample and accept a token.

        Whatever fails here (the sampler, its token, the detokenizer) fails this
        request alone.
        """
        try:
            self.accept(self.sample(logits))
        except Exception as error:
            self.fail(
                f"sampling token {len(self.generated) + 1} failed: "
                f"{type(error).__name__}: {error}"
            )

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
        elif self.offset >= self.max_seq_len:
            self.finish("max_seq_len")  # no room left in the cache to feed the token

    def finish(self, reason: str) -> None:
        self.finish_reason = reason
        self.next_token = None
        self.detokenizer.finalize()
        self.kv_cache = None

    def fail(self, message: str) -> None:
        """Finish with "error", `message` saying why; the tokens so far are kept."""
        self.error = message
        self.finish_reason = "error"
        self.next_token = None
        self.kv_cache = None

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
