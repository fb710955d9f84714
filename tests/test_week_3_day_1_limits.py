"""Week 3 Day 1: the limits a mixed step keeps.

No more requests prefill at once than there will be slots for them; a step never
feeds more rows than token_budget, an empty slot's dummy row included; an
AdaptiveChunker is asked once a step and told only the times of steps that ran a
chunk; a chunk-size policy's bad answer fails its request alone; add_request refuses
a bad arrival_step at the call. Tokens are compared with mlx-lm generating each
prompt alone on the same weights.
"""

import math

import numpy as np
import pytest

from tiny_llm_base import EngineConfig, check_int
from tiny_llm_base.mlx_lm_reference import greedy_without

from .helpers import (
    assert_like_mlx_lm,
    assert_same_tokens,
    expected_tokens,
    run_engine,
    sharpened,
    token_ids,
)
from .random_models import random_model
from .solution import tiny

pytestmark = pytest.mark.task(3)

LENGTH = ("length",)  # every request here runs to max_tokens


@pytest.fixture(scope="module")
def pair():
    mlx_model = sharpened(random_model("qwen2", 96, 6, 2, 160, 2, 211, False, seed=5))
    return mlx_model, tiny.Qwen2ModelWeek2(mlx_model, weights="float32")


def test_no_more_requests_prefill_than_there_will_be_slots(pair, tokenizer, no_eos):
    mlx_model, model = pair
    sampler, banned = no_eos
    rng = np.random.default_rng(1)
    prompts = [token_ids(rng, mlx_model.args.vocab_size, 10) for _ in range(5)]
    engine = tiny.Engine(
        model,
        tokenizer,
        batch_size=2,
        prefill_step=4,
        policy="mixed",
        max_tokens=3,
        sampler=sampler,
    )

    def check_slots(engine):
        started = [r for r in engine.waiting if r.offset > 0]
        occupied = sum(slot is not None for slot in engine.slots)
        assert occupied + len(started) <= engine.config.batch_size

    results = run_engine(engine, prompts, check_slots, max_steps=500)
    assert_like_mlx_lm(results, mlx_model, prompts, 3, tokenizer, banned, LENGTH)


def test_a_step_feeds_at_most_token_budget_rows(pair, tokenizer, monkeypatch):
    """Slot 0 finishes first, so later steps feed its empty row as a dummy."""
    mlx_model, model = pair
    banned = sorted(tokenizer.eos_token_ids)
    sampler = greedy_without(banned, mlx_model.args.vocab_size)
    fed = []
    real_forward = tiny.runner.mixed_forward

    def counting_forward(model, decode_tokens, offsets, cache, chunks, **options):
        fed.append(len(decode_tokens) + sum(len(c.tokens) for c in chunks))
        return real_forward(model, decode_tokens, offsets, cache, chunks, **options)

    monkeypatch.setattr(tiny.runner, "mixed_forward", counting_forward)
    rng = np.random.default_rng(2)
    lengths, limits = (6, 7, 8, 30, 25), (2, 12, 12, 6, 6)
    prompts = [
        tiny.PromptSpec(token_ids(rng, mlx_model.args.vocab_size, n), max_tokens=m)
        for n, m in zip(lengths, limits)
    ]
    engine = tiny.Engine(
        model,
        tokenizer,
        batch_size=3,
        prefill_step=None,
        policy="mixed",
        token_budget=5,
        sampler=sampler,
    )
    results = run_engine(engine, prompts, max_steps=500)
    assert fed and max(fed) <= 5
    for i, (spec, result) in enumerate(zip(prompts, results)):
        [(tokens, gaps)] = expected_tokens(
            mlx_model, [spec.prompt], spec.max_tokens, tokenizer, banned
        )
        assert_same_tokens(result.tokens, tokens, gaps, f"prompt {i}")


class CountingChunker:
    """Shaped like an AdaptiveChunker: a fixed size, and a log of what it is told."""

    def __init__(self):
        self.asked = 0
        self.recorded = []

    def select_chunk_size(self, decoding: int, batch_size: int) -> int:
        self.asked += 1
        return 3

    def record(self, seconds: float) -> None:
        self.recorded.append(seconds)


def test_an_adaptive_chunker_is_asked_once_a_mixed_step(pair, tokenizer, no_eos):
    mlx_model, model = pair
    sampler, banned = no_eos
    rng = np.random.default_rng(3)
    prompts = [token_ids(rng, mlx_model.args.vocab_size, n) for n in (9, 7, 5, 8)]
    chunker = CountingChunker()
    forwards = []
    engine = tiny.Engine(
        model,
        tokenizer,
        batch_size=4,
        prefill_step=chunker,
        policy="mixed",
        max_tokens=4,
        sampler=sampler,
        on_forward=forwards.append,
    )

    def check_asked(engine):
        assert chunker.asked <= engine.steps_done

    results = run_engine(engine, prompts, check_asked, max_steps=500)
    with_chunks = [f for f in forwards if f.chunks]
    assert len(chunker.recorded) == len(with_chunks)
    assert chunker.asked == len(with_chunks)
    assert all(tokens <= 3 for f in forwards for _, tokens in f.chunks)
    assert_like_mlx_lm(results, mlx_model, prompts, 4, tokenizer, banned, LENGTH)


@pytest.mark.parametrize("policy", ["alternate", "mixed"])
@pytest.mark.parametrize("bad_size", [4.0, 0, -2, "4"])
def test_a_policys_bad_chunk_size_fails_its_request_alone(
    pair, tokenizer, no_eos, policy, bad_size
):
    mlx_model, model = pair
    sampler, banned = no_eos
    rng = np.random.default_rng(4)
    good = [token_ids(rng, mlx_model.args.vocab_size, n) for n in (9, 6)]
    bad = token_ids(rng, mlx_model.args.vocab_size, 13)

    def policy_function(prompt_tokens: int, decoding: int, batch_size: int):
        return bad_size if prompt_tokens == 13 else 4

    engine = tiny.Engine(
        model,
        tokenizer,
        batch_size=2,
        prefill_step=policy_function,
        policy=policy,
        max_tokens=3,
        sampler=sampler,
    )
    first, failed, last = run_engine(engine, [good[0], bad, good[1]], max_steps=500)
    assert failed.finish_reason == "error" and "chunk size" in failed.error
    assert_like_mlx_lm([first, last], mlx_model, good, 3, tokenizer, banned, LENGTH)


@pytest.mark.parametrize("bad_size", [0, 2.5])
def test_plan_chunks_fails_a_bad_chunk_size_as_the_alternate_policy_does(
    pair, tokenizer, bad_size
):
    """Asked of plan_chunks directly: the request whose chunk size is bad fails
    with the alternate policy's words, f"prefill failed: {type(error).__name__}:
    {error}", and the next request asks again and gets its chunk."""
    _, model = pair
    bad, good = (
        tiny.Request(model, tokenizer, list(range(10, 10 + n))) for n in (7, 5)
    )

    def prefill_step(prompt_tokens, decoding, batch_size):
        return bad_size if prompt_tokens == 7 else None

    config = EngineConfig(
        batch_size=2, max_seq_len=64, prefill_step=prefill_step, policy="mixed"
    )
    planner = tiny.Planner(config, tiny.DenseKvManager(model, config))
    policy = tiny.MixedPolicy(planner)
    planner.add(bad)
    planner.add(good)
    chunks = policy.plan_chunks([], math.inf)
    with pytest.raises((TypeError, ValueError)) as error:  # the planner's check
        check_int("the chunk size prefill_step chose", bad_size, 1, allow_none=True)
    expected = f"prefill failed: {error.type.__name__}: {error.value}"
    assert bad.finish_reason == "error" and bad.error == expected
    assert chunks == [(good, 5)], "the next request asks again"


@pytest.mark.parametrize(
    "arrival_step, error", [(None, TypeError), ("1", TypeError), (-1, ValueError)]
)
def test_add_request_refuses_a_bad_arrival_step(pair, tokenizer, arrival_step, error):
    _, model = pair
    engine = tiny.Engine(model, tokenizer, batch_size=2, policy="mixed")
    with pytest.raises(error, match="arrival_step"):
        engine.add_request(tiny.PromptSpec([1, 2, 3], arrival_step=arrival_step))
    assert not engine.has_unfinished()
