"""Week 2 Day 6, the request's sampling state: logprobs, seeds, penalties, n choices
through batch_generate and the Engine (dense KV cache, alternate policy, each prompt
prefilled whole). The Request calls the given SamplingState (tiny_llm_base) in
sample, accept and try_prefill; these tests check what comes out against an
independent computation: mlx-lm's model with the same weights (one forward over
the whole sequence, log-softmax at each position), and a NumPy greedy decoding
with OpenAI's and vLLM's penalty formulas over mlx-lm's logits.
"""

import mlx.core as mx
import numpy as np
import pytest

from tiny_llm_base import PromptSpec, SamplingOptions

from .helpers import (
    NEAR_TIE,
    assert_prompt_logprobs,
    assert_same_tokens,
    assert_token_logprob,
    mlx_lm_logprobs,
    numpy_penalized,
    token_ids,
)
from .solution import tiny

pytestmark = pytest.mark.task(4)


def prompt(seed: int, length: int = 12) -> list[int]:
    return token_ids(np.random.default_rng(seed), 200, length)


def generate(pair, tokenizer, specs, batch_size: int = 2):
    return tiny.batch_generate(
        pair[1], tokenizer, specs, prefill_step=None, batch_size=batch_size
    )


def test_generated_logprobs_are_mlx_lm_log_softmax_at_each_position(pair, tokenizer):
    ids = prompt(0)
    options = SamplingOptions(logprobs=4, ignore_eos=True)
    [result] = generate(pair, tokenizer, [PromptSpec(ids, 6, options=options)])
    assert len(result.logprobs) == len(result.tokens) == 6
    expected = mlx_lm_logprobs(pair[0], ids + result.tokens)
    for i, (token, entry) in enumerate(zip(result.tokens, result.logprobs)):
        assert_token_logprob(entry, token, expected[len(ids) - 1 + i], 4)


def test_logprobs_are_the_models_before_bias_penalties_and_temperature(pair, tokenizer):
    """The distribution reported is the model's log-softmax (after a constraint's
    mask, none here), not the one the token was drawn from: a hot temperature, a
    bias and penalties change the tokens, never their reported logprobs."""
    ids = prompt(11)
    options = SamplingOptions(
        logprobs=3,
        seed=5,
        frequency_penalty=1.0,
        repetition_penalty=1.5,
        logit_bias={4: 8.0},
        ignore_eos=True,
    )
    spec = PromptSpec(ids, 6, sampler=tiny.make_sampler(2.0), options=options)
    [result] = generate(pair, tokenizer, [spec])
    expected = mlx_lm_logprobs(pair[0], ids + result.tokens)
    for i, (token, entry) in enumerate(zip(result.tokens, result.logprobs)):
        assert_token_logprob(entry, token, expected[len(ids) - 1 + i], 3)


def test_prompt_logprobs_are_mlx_lm_log_softmax_of_each_next_prompt_token(
    pair, tokenizer
):
    ids = prompt(1, 15)
    options = SamplingOptions(prompt_logprobs=2)
    [result] = generate(pair, tokenizer, [PromptSpec(ids, 1, options=options)])
    assert_prompt_logprobs(result.prompt_logprobs, ids, pair[0], 2)
    assert result.logprobs == []  # only the prompt's were asked


@pytest.mark.parametrize(
    "frequency, presence, repetition, bias",
    [(1.5, 0.0, 1.0, {}), (0.0, 2.0, 1.0, {}), (0.4, 0.3, 1.8, {5: 3.0, 9: -2.0})],
)
def test_penalised_greedy_answers_match_numpy_over_mlx_lm_logits(
    pair, tokenizer, frequency, presence, repetition, bias
):
    ids = prompt(2)
    eos = sorted(tokenizer.eos_token_ids)
    options = SamplingOptions(
        frequency_penalty=frequency,
        presence_penalty=presence,
        repetition_penalty=repetition,
        logit_bias=bias or None,
        ignore_eos=True,
    )
    [result] = generate(pair, tokenizer, [PromptSpec(ids, 10, options=options)])
    expected, gaps = [], []
    for _ in range(10):
        logits = np.array(pair[0](mx.array([ids + expected]))[0, -1])
        scores = numpy_penalized(
            logits, ids, expected, frequency, presence, repetition, bias
        )
        scores[eos] = -np.inf
        top_two = np.sort(scores)[-2:]
        gaps.append(top_two[1] - top_two[0])
        expected.append(int(np.argmax(scores)))
    assert_same_tokens(result.tokens, expected, gaps, "penalised")
    plain = generate(pair, tokenizer, [PromptSpec(ids, 10)])[0].tokens
    assert result.tokens != plain or min(gaps) < NEAR_TIE  # the penalties acted


def test_a_large_logit_bias_forces_its_token(pair, tokenizer):
    options = SamplingOptions(logit_bias={17: 100.0})
    [result] = generate(pair, tokenizer, [PromptSpec(prompt(3), 5, options=options)])
    assert result.tokens == [17] * 5


def test_min_tokens_and_ignore_eos_hold_eos_back(pair, tokenizer):
    eos = min(tokenizer.eos_token_ids)
    wants_eos = {eos: 100.0}  # greedy would pick EOS at once
    specs = [
        PromptSpec(prompt(4), 6, options=SamplingOptions(logit_bias=wants_eos)),
        PromptSpec(
            prompt(4), 6, options=SamplingOptions(logit_bias=wants_eos, min_tokens=3)
        ),
        PromptSpec(
            prompt(4), 6, options=SamplingOptions(logit_bias=wants_eos, ignore_eos=True)
        ),
    ]
    eager, at_least_three, ignoring = generate(pair, tokenizer, specs)
    assert (eager.tokens, eager.finish_reason) == ([], "stop")
    assert (len(at_least_three.tokens), at_least_three.finish_reason) == (3, "stop")
    assert (len(ignoring.tokens), ignoring.finish_reason) == (6, "length")
    assert eos not in at_least_three.tokens + ignoring.tokens


def test_min_p_of_one_samples_the_greedy_answer(pair, tokenizer):
    ids = prompt(5)
    sampled = PromptSpec(
        ids,
        8,
        sampler=tiny.make_sampler(1.0),
        options=SamplingOptions(min_p=1.0, ignore_eos=True),
    )
    greedy = PromptSpec(ids, 8, options=SamplingOptions(ignore_eos=True))
    ours, expected = generate(pair, tokenizer, [sampled, greedy])
    assert ours.tokens == expected.tokens


def seeded(ids, seed, n=1, max_tokens=8):
    return PromptSpec(
        ids,
        max_tokens,
        sampler=tiny.make_sampler(1.0),
        options=SamplingOptions(seed=seed, ignore_eos=True),
        n=n,
    )


def test_a_seed_gives_the_same_tokens_alone_or_in_a_crowd(pair, tokenizer):
    ids = prompt(6)
    [alone] = generate(pair, tokenizer, [seeded(ids, 11)], batch_size=1)
    crowd = [PromptSpec(prompt(10 + i), 3 + i) for i in range(3)]
    crowd.insert(1, seeded(ids, 11))
    crowd.append(seeded(prompt(20), 5))
    crowded = tiny.batch_generate(pair[1], tokenizer, crowd, prefill_step=None)
    assert crowded[1].tokens == alone.tokens
    [other] = generate(pair, tokenizer, [seeded(ids, 12)])
    assert other.tokens != alone.tokens


def test_n_choices_each_have_an_index_and_choice_i_the_seed_plus_i(pair, tokenizer):
    ids = prompt(7)
    [result] = generate(pair, tokenizer, [seeded(ids, 11, n=3)], batch_size=4)
    assert [c.index for c in result.choices] == [0, 1, 2]
    assert result.choices[0] is result
    for i, choice in enumerate(result.choices):
        [single] = generate(pair, tokenizer, [seeded(ids, 11 + i)])
        assert choice.tokens == single.tokens, i
    greedy = generate(pair, tokenizer, [PromptSpec(ids, 5, n=2), PromptSpec(ids, 5)])
    assert [c.tokens for c in greedy[0].choices] == [greedy[1].tokens] * 2


@pytest.mark.parametrize(
    "options, message",
    [
        (SamplingOptions(logprobs=21), "logprobs must be"),
        (SamplingOptions(repetition_penalty=0), "repetition_penalty must be"),
        (SamplingOptions(logit_bias={10**6: 1.0}), "logit_bias has token id"),
    ],
)
def test_a_bad_option_fails_its_request_alone(pair, tokenizer, options, message):
    bad, good = generate(
        pair,
        tokenizer,
        [PromptSpec(prompt(8), 4, options=options), PromptSpec(prompt(9), 4)],
    )
    assert bad.finish_reason == "error" and message in bad.error
    assert good.finish_reason in ("stop", "length") and good.error is None


def test_n_below_one_is_refused(pair, tokenizer):
    with pytest.raises(ValueError, match="n must be at least 1"):
        generate(pair, tokenizer, [PromptSpec(prompt(8), 4, n=0)])


def test_aborting_one_choice_leaves_the_others_running(pair, tokenizer):
    engine = tiny.Engine(pair[1], tokenizer, batch_size=3, prefill_step=None)
    spec = PromptSpec(prompt(9), 8, options=SamplingOptions(ignore_eos=True), n=3)
    request_id = engine.add_request(spec)
    engine.step()
    engine.abort(request_id, 1)
    finished = {}
    for _ in range(20):
        for output in engine.step():
            assert output.request_id == request_id
            if output.result is not None:
                finished[output.index] = output.result
        if not engine.has_unfinished():
            break
    assert finished[1].finish_reason == "abort" and len(finished[1].tokens) < 8
    assert [finished[i].finish_reason for i in (0, 2)] == ["length", "length"]
    assert finished[0].tokens == finished[2].tokens


def test_outputs_carry_the_logprobs_of_their_tokens(pair, tokenizer):
    engine = tiny.Engine(pair[1], tokenizer, batch_size=2, prefill_step=None)
    options = SamplingOptions(logprobs=1, prompt_logprobs=0, ignore_eos=True)
    engine.add_request(PromptSpec(prompt(10), 4, options=options))
    outputs = []
    while engine.has_unfinished():
        outputs += engine.step()
    result = outputs[-1].result
    assert outputs[0].prompt_logprobs == result.prompt_logprobs
    assert all(o.prompt_logprobs is None for o in outputs[1:])
    streamed = [entry for o in outputs for entry in o.logprobs]
    assert streamed == result.logprobs
    assert [e.token for e in streamed] == result.tokens
