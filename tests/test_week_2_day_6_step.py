"""Week 2 Day 6, task 3: a step without the engine.

The test plays the engine's loop by hand: each iteration runs every plan the
AlternatePolicy yields through the ModelRunner (a chunk's forward, then the decode
rows' forward) and retires the finished requests. Three requests share two slots;
each must get mlx-lm's greedy tokens, as if it ran alone, and the third must take
the first free slot. Reference: mlx-lm's model on the same weights, fed the whole
sequence each time, its argmax with EOS banned.
"""

import time

import mlx.core as mx
import numpy as np
import pytest

from tiny_llm_base import EngineConfig

from .solution import tiny
from .test_week_2_day_6_request import mlx_lm_greedy, prompt_ids

pytestmark = pytest.mark.task(3)


def make_step(model, batch_size=2):
    config = EngineConfig(batch_size=batch_size, max_seq_len=64)
    kv = tiny.DenseKvManager(model, config)
    planner = tiny.Planner(config, kv)
    policy = tiny.AlternatePolicy(planner)
    runner = tiny.ModelRunner(model, time.perf_counter, kv)
    return planner, policy, runner


def iterate(planner, policy, runner) -> list:
    """One iteration of the engine's loop; the forwards that ran."""
    forwards = []
    for plan in policy.plans():
        if plan:
            forwards.append(runner.run(plan))
            planner.retire_finished()
    return forwards


class FailingDecodes:
    """The model, but a decode forward (one token per row) raises `error`."""

    def __init__(self, model, error: Exception):
        self.model = model
        self.error = error

    def __call__(self, tokens, offset, cache, **options):
        if tokens.shape[1] == 1 and not isinstance(offset, int):
            raise self.error
        return self.model(tokens, offset, cache, **options)

    def __getattr__(self, name):
        return getattr(self.model, name)


def test_three_requests_in_two_slots_get_their_tokens_alone(pair, tokenizer, no_eos):
    mlx_model, model = pair
    sampler, banned = no_eos
    vocab = mlx_model.args.vocab_size
    prompts = [prompt_ids(vocab, 5 + 3 * i, seed=i) for i in range(3)]
    limits = [2, 6, 3]
    requests = [
        tiny.Request(model, tokenizer, p, max_tokens=m, sampler=sampler)
        for p, m in zip(prompts, limits)
    ]
    planner, policy, runner = make_step(model)
    for request in requests:
        planner.add(request)
    slots_seen = []
    for _ in range(30):
        if not (planner.waiting or planner.decoding()):
            break
        forwards = iterate(planner, policy, runner)
        assert all(f is not None for f in forwards), "no forward may fail here"
        assert len(forwards) <= 2, "at most a chunk's forward and a decode forward"
        slots_seen.append([requests.index(r) if r else None for r in planner.slots])
    else:
        pytest.fail("the requests did not finish in 30 iterations")
    for request, prompt, limit in zip(requests, prompts, limits):
        assert request.finish_reason == "length"
        assert request.generated == mlx_lm_greedy(mlx_model, prompt, limit, banned)
    assert planner.slots == [None, None] and planner.waiting == []
    # Request 0 finishes in the iteration that prefilled it (2 tokens: the
    # prefill's, then one decode); 1 and 2 then decode side by side, lowest slot
    # first, and 1 keeps its slot while 2 finishes and leaves.
    assert [1, 2] in slots_seen, f"1 and 2 never decoded together: {slots_seen}"


def test_a_failing_decode_forward_fails_its_requests_alone(pair, tokenizer, no_eos):
    mlx_model, model = pair
    sampler = no_eos[0]
    vocab = mlx_model.args.vocab_size

    failing = FailingDecodes(model, RuntimeError("no decode today"))
    request = tiny.Request(
        failing, tokenizer, prompt_ids(vocab, 6), max_tokens=4, sampler=sampler
    )
    planner, policy, runner = make_step(failing)
    planner.add(request)
    forwards = iterate(planner, policy, runner)
    assert forwards[0] is not None, "the prefill ran"
    assert forwards[1] is None, "a failed forward gives no Forward"
    assert request.finish_reason == "error" and "no decode today" in request.error
    assert planner.slots == [None, None], "a failed request leaves its slot"
    assert len(request.generated) == 1, "it keeps the token it had"
    mx.eval(mx.zeros(1))  # nothing of the failed step is left pending
    np.testing.assert_equal(len(planner.waiting), 0)


@pytest.mark.parametrize("size, error", [(0, "ValueError"), (2.5, "TypeError")])
def test_a_bad_chunk_size_fails_its_request_and_runs_no_chunk_that_step(
    pair, tokenizer, no_eos, size, error
):
    mlx_model, model = pair
    sampler = no_eos[0]
    vocab = mlx_model.args.vocab_size
    bad, good = (
        tiny.Request(model, tokenizer, prompt_ids(vocab, n, seed=n), sampler=sampler)
        for n in (7, 5)
    )

    def prefill_step(prompt_tokens, decoding, batch_size):
        """A policy whose answer for 7-token prompts is not a chunk size."""
        return size if prompt_tokens == 7 else None

    config = EngineConfig(batch_size=2, max_seq_len=64, prefill_step=prefill_step)
    kv = tiny.DenseKvManager(model, config)
    planner = tiny.Planner(config, kv)
    policy = tiny.AlternatePolicy(planner)
    planner.add(bad)
    planner.add(good)
    plan = policy.plan_chunk()
    assert bad.finish_reason == "error"
    assert bad.error.startswith(f"prefill failed: {error}: "), bad.error
    assert bad not in planner.waiting and bad not in planner.holding, (
        "the failed request is retired at once"
    )
    assert not plan and plan.chunks == [], "no chunk runs in the step it failed"
    assert good.offset == 0 and not good.is_finished
    assert policy.plan_chunk().chunks == [(good, 5)], "the next step prefills good"


class DecodeFault(Exception):
    """An exception whose type name no runner could guess."""


@pytest.mark.parametrize("fault", [DecodeFault, ValueError])
def test_a_failed_forwards_error_names_the_exception_type(
    pair, tokenizer, no_eos, fault
):
    mlx_model, model = pair
    vocab = mlx_model.args.vocab_size
    failing = FailingDecodes(model, fault("no decode"))
    request = tiny.Request(
        failing, tokenizer, prompt_ids(vocab, 6), max_tokens=4, sampler=no_eos[0]
    )
    planner, policy, runner = make_step(failing)
    planner.add(request)
    iterate(planner, policy, runner)
    assert request.error == f"forward failed: {fault.__name__}: no decode"
