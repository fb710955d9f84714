"""Turning next-token log-probabilities into a token: greedy, temperature, top-k, top-p."""

import math
from collections.abc import Callable

import mlx.core as mx

from tiny_llm_base import is_int

Sampler = Callable[[mx.array], mx.array]


def make_sampler(temp: float, top_p: float = 1.0, top_k: int | None = None) -> Sampler:
    """Return `sample(logprobs [B, V]) -> tokens [B]`.

    temp == 0 picks the most likely token (greedy). Otherwise the log-probabilities
    are divided by temp (below 1 sharpens, above 1 flattens), then top_k keeps the k
    most likely tokens, then top_p keeps the smallest set of most likely tokens whose
    probability reaches top_p, and one token is drawn from what is left.
    """
    # Week 1 Day 7: make_sampler (greedy, temperature, top-k, top-p)
    if not (math.isfinite(temp) and temp >= 0):
        raise ValueError(f"temp must be a number >= 0 (0 means greedy), got {temp}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1] (1 keeps every token), got {top_p}")
    if top_k is not None and (not is_int(top_k) or top_k < 1):
        raise ValueError(
            f"top_k must be an int >= 1, or None to keep every token; got {top_k!r}"
        )

    def sample(logprobs: mx.array) -> mx.array:
        if temp == 0:
            return mx.argmax(logprobs, axis=-1)
        logits = logprobs / temp
        if top_k is not None and top_k < logits.shape[-1]:
            logits = keep_top_k(logits, top_k)
        if top_p < 1:
            logits = keep_top_p(logits, top_p)
        return mx.random.categorical(logits, axis=-1)

    return sample


def keep_top_k(logits: mx.array, k: int) -> mx.array:
    """logits: [B, V]; every token outside each row's k largest becomes -inf."""
    # Week 1 Day 7: keep_top_k (mx.argpartition, then -inf the rest)
    # argpartition puts the k largest first, in no particular order: drop the rest.
    dropped = mx.argpartition(-logits, kth=k - 1, axis=-1)[:, k:]
    return mx.put_along_axis(logits, dropped, mx.array(-mx.inf, logits.dtype), axis=-1)


def keep_top_p(logits: mx.array, p: float) -> mx.array:
    """logits: [B, V]; keep the most likely tokens until their probability reaches p.

    A token is kept when the probability of all more likely tokens is still below
    p, so the most likely token always survives.
    """
    # Week 1 Day 7: keep_top_p (sort, cumulative sum, -inf the tail)
    order = mx.argsort(-logits, axis=-1)
    sorted_logits = mx.take_along_axis(logits, order, axis=-1)
    sorted_probs = mx.softmax(sorted_logits.astype(mx.float32), axis=-1)
    mass_before = mx.cumsum(sorted_probs, axis=-1) - sorted_probs
    sorted_logits = mx.where(mass_before < p, sorted_logits, -mx.inf)
    return mx.put_along_axis(logits, order, sorted_logits, axis=-1)
