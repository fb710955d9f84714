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
    raise NotImplementedError(
        "Week 1 Day 7: make_sampler (greedy, temperature, top-k, top-p)"
    )


def keep_top_k(logits: mx.array, k: int) -> mx.array:
    """logits: [B, V]; every token outside each row's k largest becomes -inf."""
    raise NotImplementedError(
        "Week 1 Day 7: keep_top_k (mx.argpartition, then -inf the rest) argpartition "
        "puts the k largest first, in no particular order: drop the rest."
    )


def keep_top_p(logits: mx.array, p: float) -> mx.array:
    """logits: [B, V]; keep the most likely tokens until their probability reaches p.

    A token is kept when the probability of all more likely tokens is still below
    p, so the most likely token always survives.
    """
    raise NotImplementedError(
        "Week 1 Day 7: keep_top_p (sort, cumulative sum, -inf the tail)"
    )
