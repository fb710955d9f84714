"""Turning next-token log-probabilities into a token: greedy, temperature, top-k, top-p."""

import math
from collections.abc import Callable
from dataclasses import dataclass

import mlx.core as mx

from tiny_llm_base import is_int

Sampler = Callable[[mx.array], mx.array]


@dataclass(frozen=True)
class TokenSampler:
    """`sampler(logprobs [B, V]) -> tokens [B]` with temperature, top-k and top-p.

    temp == 0 picks the most likely token (greedy). Otherwise one token is drawn from
    `logits(logprobs)`: the log-probabilities divided by temp (below 1 sharpens,
    above 1 flattens), then top_k keeps the k most likely tokens, then top_p keeps
    the smallest set of most likely tokens whose probability reaches top_p. Its
    settings stay readable: week 3 day 4's speculative decoding needs the very
    distribution the sampler draws from.
    """

    temp: float
    top_p: float = 1.0
    top_k: int | None = None

    def logits(self, logprobs: mx.array) -> mx.array:
        """logprobs: [B, V] -> the logits [B, V] a token is drawn from (temp > 0):
        scaled by temp, every token outside top_k and top_p at -inf."""
        # Week 1 Day 7 Task 1: TokenSampler.logits: divide by temp, then keep_top_k
        # (when top_k < V), then keep_top_p (when top_p < 1)
        logits = logprobs / self.temp
        if self.top_k is not None and self.top_k < logits.shape[-1]:
            logits = keep_top_k(logits, self.top_k)
        if self.top_p < 1:
            logits = keep_top_p(logits, self.top_p)
        return logits

    def __call__(self, logprobs: mx.array) -> mx.array:
        # Week 1 Day 7 Task 1: TokenSampler.__call__: argmax when temp == 0, else
        # mx.random.categorical over logits(logprobs)
        if self.temp == 0:
            return mx.argmax(logprobs, axis=-1)
        return mx.random.categorical(self.logits(logprobs), axis=-1)


def make_sampler(temp: float, top_p: float = 1.0, top_k: int | None = None) -> Sampler:
    """A TokenSampler, once the settings are checked: temp a finite number >= 0 (0
    means greedy), top_p in (0, 1], top_k an int >= 1 or None."""
    # Week 1 Day 7 Task 1: make_sampler: ValueError for a bad temp, top_p or top_k; else
    # TokenSampler(temp, top_p, top_k)
    if not (math.isfinite(temp) and temp >= 0):
        raise ValueError(f"temp must be a number >= 0 (0 means greedy), got {temp}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1] (1 keeps every token), got {top_p}")
    if top_k is not None and (not is_int(top_k) or top_k < 1):
        raise ValueError(
            f"top_k must be an int >= 1, or None to keep every token; got {top_k!r}"
        )
    return TokenSampler(temp, top_p, top_k)


def keep_top_k(logits: mx.array, k: int) -> mx.array:
    """logits: [B, V]; every token outside each row's k largest becomes -inf."""
    # Week 1 Day 7 Task 2: keep_top_k (mx.argpartition, then -inf the rest)
    # argpartition puts the k largest first, in no particular order: drop the rest.
    dropped = mx.argpartition(-logits, kth=k - 1, axis=-1)[:, k:]
    return mx.put_along_axis(logits, dropped, mx.array(-mx.inf, logits.dtype), axis=-1)


def keep_top_p(logits: mx.array, p: float) -> mx.array:
    """logits: [B, V]; keep the most likely tokens until their probability reaches p.

    A token is kept when the probability of all more likely tokens is still below
    p, so the most likely token always survives.
    """
    # Week 1 Day 7 Task 3: keep_top_p (sort, cumulative sum, -inf the tail)
    order = mx.argsort(-logits, axis=-1)
    sorted_logits = mx.take_along_axis(logits, order, axis=-1)
    sorted_probs = mx.softmax(sorted_logits.astype(mx.float32), axis=-1)
    mass_before = mx.cumsum(sorted_probs, axis=-1) - sorted_probs
    sorted_logits = mx.where(mass_before < p, sorted_logits, -mx.inf)
    return mx.put_along_axis(logits, order, sorted_logits, axis=-1)
