"""Token embedding: a lookup table, which doubles as the output layer when tied."""

import mlx.core as mx

from .basics import linear


class Embedding:
    """weight: [vocab_size, embedding_dim], one row per token id."""

    def __init__(self, vocab_size: int, embedding_dim: int, weight: mx.array):
        # Week 1 Day 5 Task 1: Embedding.__init__ (keep the table)
        self.vocab_size = vocab_size
        self.embedding_dim = embedding_dim
        self.weight = weight

    def __call__(self, ids: mx.array) -> mx.array:
        """ids: [...] integers -> [..., embedding_dim]: row ids of the table."""
        # Week 1 Day 5 Task 1: Embedding (look up rows)
        return self.weight[ids]

    def as_linear(self, x: mx.array) -> mx.array:
        """x: [..., embedding_dim] -> logits [..., vocab_size].

        Tied models reuse the table as the language-model head: the logit of token t
        is the dot product of x with t's embedding.
        """
        # Week 1 Day 5 Task 1: Embedding.as_linear (x @ weight.T)
        return linear(x, self.weight)
