"""Training the draft head (week 4 day 3): the model's own answers teach it.

The data: the model answers prompts (batch_generate, greedy), and one forward over
each prompt and answer gives its hidden state at every position. An example is a
position t of an answer and what follows it:

    feature f_t [E] (the model's, normed)   tokens x_t+1, x_t+2, x_t+3
    targets f_t+1, f_t+2 [2, E]

The loss drafts twice, the second time from the head's own first prediction, as
drafting will (EAGLE's "training-time test"): trained only on the model's features,
a head's second guess from its own is little better than chance.

    p1 = head(f_t, x_t+1): smooth L1 to f_t+1, cross-entropy to x_t+2
    p2 = head(p1,  x_t+2): smooth L1 to f_t+2, cross-entropy to x_t+3

A token outside the draft vocabulary counts in neither cross-entropy.
"""

from collections.abc import Callable
from dataclasses import dataclass

import mlx.core as mx
import mlx.optimizers as optim
import numpy as np
from mlx import nn

from .draft_head import DraftHead

# The cross-entropy's weight beside the features' smooth L1 (EAGLE: 0.1).
TOKEN_LOSS_WEIGHT = 0.1


@dataclass
class DraftExamples:
    """N examples: features [N, E] (f_t), tokens [N, 3] (x_t+1 .. x_t+3), targets
    [N, 2, E] (f_t+1, f_t+2)."""

    features: mx.array
    tokens: mx.array
    targets: mx.array

    def __len__(self) -> int:
        return self.features.shape[0]

    def take(self, rows: mx.array) -> "DraftExamples":
        return DraftExamples(self.features[rows], self.tokens[rows], self.targets[rows])


def hidden_states(model, sequences: list[list[int]], batch: int = 8) -> list[mx.array]:
    """Each sequence's last-layer output [T, E] (before the final norm), from a
    Qwen2ModelWeek2: `batch` sequences a forward, each padded at its end (causal
    attention: a padding token is never seen by the positions before it)."""
    out = []
    for start in range(0, len(sequences), batch):
        group = sequences[start : start + batch]
        width = max(map(len, group))
        ids = mx.array([s + [0] * (width - len(s)) for s in group])
        cache = model.create_kv_cache()
        h = model.embedding(ids)
        for layer, layer_cache in zip(model.layers, cache):
            h = layer(h, 0, layer_cache)
        mx.eval(h)
        out += [h[row, : len(s)] for row, s in enumerate(group)]
    return out


def draft_examples(
    head: DraftHead,
    sequences: list[list[int]],
    prompt_lengths: list[int],
    hidden: list[mx.array],
) -> DraftExamples:
    """The examples of every sequence (prompt and answer, its hidden states [T, E];
    every prompt at least one token): one per position t from the prompt's last
    (t = prompt length - 1, whose x_t+1 is the answer's first token) to T - 4, so
    that x_t+3 exists. A sequence too short for any adds none."""
    raise NotImplementedError(
        "Week 4 Day 3 Task 2: draft_examples: for each sequence, positions t from "
        "prompt_length - 1 to T - 4; features head.features(hidden)[t], tokens at t +"
        " 1 .. t + 3, targets the features at t + 1 and t + 2; all sequences "
        "concatenated"
    )


def draft_loss(head: DraftHead, batch: DraftExamples) -> mx.array:
    """The module docstring's loss, averaged over the batch: both smooth L1s (mean
    over examples and E) plus TOKEN_LOSS_WEIGHT times both cross-entropies (mean over
    the examples whose token is in the draft vocabulary; 0 when none is)."""
    raise NotImplementedError(
        "Week 4 Day 3 Task 2: draft_loss: p1 = head(f_t, x_t+1), p2 = head(p1, "
        "x_t+2); nn.losses.smooth_l1_loss to the targets; the cross-entropy of "
        "head.logits over the draft vocabulary (head.index_of: -1 for a token outside"
        " it, masked out)"
    )


def acceptance(head: DraftHead, examples: DraftExamples) -> tuple[float, float]:
    """What greedy drafting would keep on these examples: the share whose first
    draft is x_t+2, and the share whose first two drafts are x_t+2 and x_t+3."""
    raise NotImplementedError(
        "Week 4 Day 3 Task 2: acceptance: two drafts each with head.guess, compared "
        "with the tokens"
    )


def train_head(
    head: DraftHead,
    examples: DraftExamples,
    epochs: int,
    batch_size: int = 256,
    learning_rate: float = 1e-3,
    seed: int = 0,
    on_batch: Callable[[int, float], None] | None = None,
) -> list[float]:
    """Train `head` in place with AdamW on draft_loss, the examples shuffled anew
    each epoch (numpy's generator from `seed`). Returns each epoch's mean loss
    (the plain mean of its batches' losses); on_batch(batches done, loss) after
    each batch (a progress bar)."""
    raise NotImplementedError(
        "Week 4 Day 3 Task 2: train_head: nn.value_and_grad(head, draft_loss), an "
        "optim.AdamW, batches of a permutation; evaluate the parameters and the "
        "optimizer's state after each update"
    )
