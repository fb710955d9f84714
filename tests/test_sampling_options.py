"""tiny_llm_base.sampling_options: what a request's SamplingOptions do to the logits,
checked against numpy implementations of OpenAI's and vLLM's formulas on random
logits (no model: the engine-level tests are the day tests'
test_week_2_day_6_sampling.py and the server's test_serve_sampling.py)."""

import math

import mlx.core as mx
import numpy as np
import pytest

from tiny_llm_base import PlainSampling, SamplingOptions, greedy, start_sampling
from tiny_llm_base.sampling_options import keep_min_p, token_logprobs

from .helpers import numpy_penalized

VOCAB = 50
EOS = 7
PROMPT = [1, 2, 3, 3]


class Tempered:
    """A sampler at temperature 1 that says so, as make_sampler's TokenSampler does
    (temp, and the logits it draws from)."""

    temp = 1.0

    def logits(self, logprobs: mx.array) -> mx.array:
        return logprobs / self.temp

    def __call__(self, logprobs: mx.array) -> mx.array:
        return mx.random.categorical(self.logits(logprobs), axis=-1)


def state_of(sampler=greedy, **options):
    return start_sampling(SamplingOptions(**options), PROMPT, sampler, {EOS}, VOCAB)


def random_logits(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 3, (1, VOCAB)).astype(np.float32)


def test_plain_options_give_the_plain_state():
    assert isinstance(start_sampling(None, PROMPT, greedy, {EOS}, VOCAB), PlainSampling)
    assert isinstance(state_of(), PlainSampling)
    logits = mx.array(random_logits(0))
    state = PlainSampling()
    assert state.process(logits) is logits and state.allows_drafts


@pytest.mark.parametrize(
    "frequency, presence, repetition, bias",
    [(0.5, 0.0, 1.0, {}), (0.0, -1.5, 1.0, {}), (1.2, 0.7, 1.3, {4: 5.0, 9: -100.0})],
)
def test_penalties_and_bias_follow_the_numpy_formulas(
    frequency, presence, repetition, bias
):
    state = state_of(
        frequency_penalty=frequency,
        presence_penalty=presence,
        repetition_penalty=repetition,
        logit_bias=bias or None,
    )
    answer = [5, 5, 9, 3, 5]
    for token in answer:
        state.advance(token)
    logits = random_logits(1)
    ours = np.array(state.process(mx.array(logits)))[0]
    expected = numpy_penalized(
        logits[0], PROMPT, answer, frequency, presence, repetition, bias
    )
    np.testing.assert_allclose(ours, expected, rtol=1e-6, atol=1e-5)
    assert not state.allows_drafts


def test_a_masked_token_stays_masked_whatever_the_bias():
    state = state_of(logit_bias={4: 100.0}, repetition_penalty=2.0)
    logits = random_logits(2)
    logits[0, 4] = -np.inf
    assert np.array(state.process(mx.array(logits)))[0, 4] == -np.inf


def test_min_tokens_bans_eos_until_enough_tokens_then_not():
    state = state_of(min_tokens=2)
    logits = mx.array(random_logits(3))
    for _ in range(2):
        assert np.array(state.process(logits))[0, EOS] == -np.inf
        state.advance(11)
    assert np.array(state.process(logits))[0, EOS] == np.array(logits)[0, EOS]
    ignore = state_of(ignore_eos=True)
    for _ in range(5):
        assert np.array(ignore.process(logits))[0, EOS] == -np.inf
        ignore.advance(11)


def test_min_p_keeps_tokens_within_min_p_of_the_top_at_the_temperature():
    logprobs = mx.array(np.log(np.array([[0.5, 0.3, 0.15, 0.05]], np.float32)))
    for temp in (1.0, 0.5, 2.0):
        probs = np.array(mx.softmax(logprobs / temp, axis=-1))[0]
        kept = np.isfinite(np.array(keep_min_p(logprobs, 0.4, temp))[0])
        np.testing.assert_array_equal(kept, probs >= 0.4 * probs.max())


def test_logprobs_are_the_log_softmax_of_the_logits_the_sampler_saw():
    state = state_of(logprobs=3)
    logits = random_logits(4)
    state.process(mx.array(logits))
    state.advance(6)
    expected = logits[0] - np.log(np.exp(logits[0].astype(np.float64)).sum())
    [entry] = state.logprobs
    assert entry.token == 6 and math.isclose(entry.logprob, expected[6], abs_tol=1e-5)
    top = np.argsort(-expected)[:3]
    assert [t for t, _ in entry.top] == top.tolist()
    np.testing.assert_allclose([v for _, v in entry.top], expected[top], atol=1e-5)


def test_logprobs_are_over_the_tokens_the_mask_leaves():
    """After a constraint's mask: the allowed tokens' log-softmax, refused tokens
    out of the top; the bias and penalties after it change nothing reported."""
    state = state_of(logprobs=5, logit_bias={2: 50.0}, frequency_penalty=2.0)
    logits = random_logits(8)
    logits[0, 8:] = -np.inf
    state.process(mx.array(logits))
    state.advance(3)
    allowed = logits[0, :8].astype(np.float64)
    expected = allowed - np.log(np.exp(allowed).sum())
    [entry] = state.logprobs
    assert math.isclose(entry.logprob, expected[3], abs_tol=1e-5)
    assert [t for t, _ in entry.top] == np.argsort(-expected)[:5].tolist()


def test_prompt_logprobs_cover_each_position_once_and_refuse_a_gap():
    prompt = [4, 8, 15, 16, 23, 42]
    state = start_sampling(
        SamplingOptions(prompt_logprobs=1), prompt, greedy, {EOS}, VOCAB
    )
    logits = random_logits(5)[0]
    rows = np.stack([np.roll(logits, i) for i in range(len(prompt))])
    state.observe_prompt(mx.array(rows[:2]), 0)  # positions 0-1 predict 1-2
    state.observe_prompt(mx.array(rows[2:]), 2)  # 2-5 predict 3-5 (5: the answer)
    state.observe_prompt(mx.array(rows), 0)  # a restart's second prefill: nothing
    assert state.prompt_logprobs[0] is None and len(state.prompt_logprobs) == 6
    for position in range(1, 6):
        row = rows[position - 1].astype(np.float64)
        expected = row[prompt[position]] - np.log(np.exp(row).sum())
        entry = state.prompt_logprobs[position]
        assert entry.token == prompt[position]
        assert math.isclose(entry.logprob, expected, abs_tol=1e-5)
    gap = start_sampling(SamplingOptions(prompt_logprobs=0), prompt, greedy, {}, VOCAB)
    with pytest.raises(ValueError, match="no logits"):
        gap.observe_prompt(mx.array(rows[3:]), 3)


def test_a_seeded_draw_repeats_and_ignores_the_shared_random_state():
    sampler = Tempered()
    logprobs = mx.array(random_logits(6)) - 5.0

    def draws(seed: int) -> list[int]:
        state = state_of(sampler, seed=seed)
        mx.random.seed(len(str(seed)) * 1000 + seed)  # the shared state differs
        return [state.draw(sampler, logprobs).item() for _ in range(20)]

    assert draws(7) == draws(7)
    assert draws(7) != draws(8)


def test_token_logprobs_leave_out_refused_tokens():
    logits = random_logits(7)
    logits[0, 10:] = -np.inf
    [entry] = token_logprobs(mx.array(logits), [3], 20)
    assert len(entry.top) == 10 and all(t < 10 for t, _ in entry.top)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"logprobs": 21}, "logprobs must be None or an int in"),
        ({"prompt_logprobs": -1}, "prompt_logprobs must be"),
        ({"frequency_penalty": 2.5}, "frequency_penalty must be a number in"),
        ({"presence_penalty": math.nan}, "presence_penalty must be"),
        ({"repetition_penalty": 0}, "repetition_penalty must be a number > 0"),
        ({"min_p": 1.5}, "min_p must be"),
        ({"min_tokens": -1}, "min_tokens must be an int >= 0"),
        ({"logit_bias": {VOCAB: 1.0}}, "logit_bias has token id 50"),
        ({"logit_bias": {1: 101.0}}, r"logit_bias\[1\] must be a number in"),
        ({"seed": 1.5}, "seed must be an int"),
    ],
)
def test_a_bad_option_says_which(options, message):
    with pytest.raises((TypeError, ValueError), match=message):
        state_of(**options)


def test_a_seed_needs_a_sampler_whose_distribution_is_known():
    with pytest.raises(TypeError, match="seed and min_p need a sampler"):
        state_of(lambda logprobs: mx.argmax(logprobs, axis=-1), seed=1)
