"""Token embedding: a lookup table, which doubles as the output layer when tied."""

import mlx.core as mx

from .basics import linear


class Embedding:
    """weight: [vocab_size, embedding_dim], one row per token id."""

    def __init__(self, vocab_size: int, embedding_dim: int, weight: mx.array):
        raise NotImplementedError(
            "Week 1 Day 5 Task 1: Embedding.__init__ (keep the table)"
        )

    def __call__(self, ids: mx.array) -> mx.array:
        """ids: [...] integers -> [..., embedding_dim]: row ids of the table."""
        raise NotImplementedError("Week 1 Day 5 Task 1: Embedding (look up rows)")

    def as_linear(self, x: mx.array) -> mx.array:
        """x: [..., embedding_dim] -> logits [..., vocab_size].

        Tied models reuse the table as the language-model head: the logit of token t
        is the dot product of x with t's embedding.
        """
        raise NotImplementedError(
            "Week 1 Day 5 Task 1: Embedding.as_linear (x @ weight.T)"
        )
