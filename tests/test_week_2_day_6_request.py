"""Week 2 Day 6, task 1: a request's life on its own, before any engine.

A Request prefills its prompt with try_prefill, samples its first token from the
prefill's last position, then decodes one token a step: feed next_token at offset,
advance by one, sample_and_accept the logits. Its counters (offset, tokens,
finish_reason) say where it is. Reference: mlx-lm's model on the same weights, fed
the whole sequence each time (no cache), its argmax with EOS banned.

The request runs on mlx-lm's model behind week 2's interface (MlxLmWeek2), so this
task needs nothing of the earlier days: it is the Request alone.
"""

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import make_prompt_cache

from .helpers import sharpened
from .random_models import SIZES, random_model
from .solution import tiny

pytestmark = pytest.mark.task(1)


class MlxLmWeek2:
    """mlx-lm's model with week 2's interface: model(tokens [B, L], offset, cache,
    last_position_only) -> logits, create_kv_cache(), vocab_size, context_length."""

    def __init__(self, mlx_model):
        self.mlx_model = mlx_model
        self.vocab_size = mlx_model.args.vocab_size
        self.context_length = mlx_model.args.max_position_embeddings

    def create_kv_cache(self) -> list:
        return make_prompt_cache(self.mlx_model)

    def __call__(self, tokens, offset, cache, last_position_only=False):
        assert cache[0].offset == offset, f"offset {offset}, cache {cache[0].offset}"
        logits = self.mlx_model(tokens, cache=cache)
        return logits[:, -1:, :] if last_position_only else logits


@pytest.fixture(scope="module")
def pair():
    """(mlx-lm's small random model, conftest's first pair's, and that model behind
    week 2's interface): no tiny model is built, so nothing of the earlier days."""
    mlx_model = sharpened(random_model(*SIZES[0], seed=0))
    return mlx_model, MlxLmWeek2(mlx_model)


def prompt_ids(vocab: int, length: int, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(3, vocab, length).tolist()


def mlx_lm_greedy(mlx_model, prompt: list[int], count: int, banned: list[int]):
    """`count` greedy tokens of mlx-lm's model, each from the whole sequence."""
    tokens = list(prompt)
    for _ in range(count):
        logits = mlx_model(mx.array([tokens]))[0, -1]
        logits[mx.array(banned)] = -mx.inf
        tokens.append(int(mx.argmax(logits)))
    return tokens[len(prompt) :]


def decode_one(model, request) -> None:
    """One decode step of a request alone, with its own cache: the engine's model
    runner does the same for a whole batch of rows."""
    token = mx.array([[request.next_token]])
    logits = model(token, request.offset, request.kv_cache)
    request.advance(1)
    request.sample_and_accept(logits[:, -1, :])


def test_a_request_prefills_then_decodes_like_mlx_lm(pair, tokenizer, no_eos):
    mlx_model, model = pair
    sampler, banned = no_eos
    prompt = prompt_ids(mlx_model.args.vocab_size, 11)
    request = tiny.Request(
        model, tokenizer, prompt, prefill_max_step=None, max_tokens=5, sampler=sampler
    )
    assert request.offset == 0 and not request.is_prefill_done
    assert request.next_token is None, "no token before the prefill samples one"
    assert request.try_prefill() == len(prompt)
    assert request.is_prefill_done and request.offset == len(prompt)
    assert len(request.generated) == 1 and request.next_token == request.generated[0]
    while not request.is_finished:
        decode_one(model, request)
    assert request.generated == mlx_lm_greedy(mlx_model, prompt, 5, banned)
    assert request.finish_reason == "length"
    assert request.offset == len(prompt) + 4, "the last token is never fed"
    assert request.next_token is None and request.kv_cache is None


def test_try_prefill_refuses_a_second_prefill(pair, tokenizer, no_eos):
    mlx_model, model = pair
    prompt = prompt_ids(mlx_model.args.vocab_size, 6)
    request = tiny.Request(model, tokenizer, prompt, sampler=no_eos[0])
    request.try_prefill()
    with pytest.raises(ValueError):
        request.try_prefill()


def test_eos_as_the_first_token_stops_and_is_not_kept(pair, tokenizer):
    mlx_model, model = pair
    eos = sorted(tokenizer.eos_token_ids)[0]
    prompt = prompt_ids(mlx_model.args.vocab_size, 6)

    def always_eos(logprobs: mx.array) -> mx.array:
        return mx.full((logprobs.shape[0],), eos, mx.int32)

    request = tiny.Request(model, tokenizer, prompt, sampler=always_eos)
    request.try_prefill()
    assert request.finish_reason == "stop" and request.is_finished
    assert request.generated == [] and request.next_token is None
    assert request.kv_cache is None, "a finished request drops its cache"


def test_a_request_stops_when_its_cache_is_full(pair, tokenizer, no_eos):
    mlx_model, model = pair
    prompt = prompt_ids(mlx_model.args.vocab_size, 6)
    request = tiny.Request(
        model, tokenizer, prompt, max_seq_len=9, max_tokens=None, sampler=no_eos[0]
    )
    request.try_prefill()
    while not request.is_finished:
        decode_one(model, request)
    assert request.finish_reason == "max_seq_len"
    assert request.offset == 9 and len(request.generated) == 4
