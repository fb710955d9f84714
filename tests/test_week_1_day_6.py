"""Week 1 Day 6: generating text with the week-1 model.

Reference: mlx-lm's own greedy generation (`mlx_lm.generate`, KV cache) with the
same weights, dequantized to float32, on the same chat-templated prompt. Generation without a cache is quadratic
in length, so the answers are kept short.
"""

import mlx.core as mx
import mlx_lm
import pytest
from mlx_lm.sample_utils import make_sampler as mlx_lm_make_sampler

from tiny_llm_base.mlx_lm_reference import chat_ids

from .solution import tiny

pytestmark = pytest.mark.task(1)

# Greedy decoding is compared token for token, so every prompt here was checked to
# have no near-tie (top-two logit gap >= 0.08, against differences of ~0.02 between
# the two models) among its first 12 tokens. Prompt -> max_tokens: the first one ends
# with EOS, its eighth token, before its max_tokens; the other stops at max_tokens,
# kept short because every step without a cache runs the whole sequence again.
MAX_TOKENS = {
    "What is the capital of France?": 12,
    "Explain gravity in one sentence.": 8,
}
PROMPTS = list(MAX_TOKENS)


@pytest.fixture(scope="module")
def week1_model(embedded_model):
    return tiny.Qwen2ModelWeek1(embedded_model[0])


def greedy(logprobs: mx.array) -> mx.array:
    """The most likely token of each row: what make_sampler(0.0) does on Day 7."""
    return mx.argmax(logprobs, axis=-1)


@pytest.fixture(scope="module")
def generations(embedded_model, embedded_float32_reference, week1_model):
    """prompt -> (our text, our on_text segments, mlx-lm's text), each made once."""
    _, tokenizer = embedded_model
    results = {}
    for prompt in PROMPTS:
        segments = []
        ours = tiny.simple_generate(
            week1_model,
            tokenizer,
            prompt,
            sampler=greedy,  # make_sampler is tomorrow's (Day 7)
            max_tokens=MAX_TOKENS[prompt],
            on_text=segments.append,
        )
        prompt_ids = chat_ids(tokenizer, prompt)
        expected = mlx_lm.generate(
            embedded_float32_reference,
            tokenizer,
            prompt_ids,
            max_tokens=MAX_TOKENS[prompt],
            sampler=mlx_lm_make_sampler(temp=0.0),
        )
        results[prompt] = (ours, segments, expected)
    return results


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_text_matches_mlx_lm(generations, prompt):
    ours, _, expected = generations[prompt]
    assert ours == expected
    assert len(ours) > 0


def test_capital_of_france(generations):
    ours, _, _ = generations["What is the capital of France?"]
    assert "Paris" in ours


@pytest.mark.parametrize("prompt", PROMPTS)
def test_on_text_segments_make_up_the_text(generations, prompt):
    ours, segments, _ = generations[prompt]
    assert all(segments)
    assert "".join(segments) == ours


def test_default_sampler_is_greedy(embedded_model, week1_model, generations):
    _, tokenizer = embedded_model
    prompt = PROMPTS[0]
    short = tiny.simple_generate(week1_model, tokenizer, prompt, max_tokens=2)
    assert 0 < len(short) < len(generations[prompt][0])
    assert generations[prompt][0].startswith(short)


class ScriptedSampler:
    """Returns fixed tokens, one per call, and records what it was given."""

    def __init__(self, tokens):
        self.tokens = list(tokens)
        self.calls = []

    def __call__(self, logprobs: mx.array) -> mx.array:
        self.calls.append(logprobs)
        return mx.array([self.tokens[len(self.calls) - 1]])


def test_sampler_sees_logprobs_and_eos_stops(embedded_model, week1_model):
    _, tokenizer = embedded_model
    words = tokenizer.encode("Tiny LLM, hi!")
    eos = next(iter(tokenizer.eos_token_ids))
    sampler = ScriptedSampler([*words, eos, *words])
    segments = []
    text = tiny.simple_generate(
        week1_model,
        tokenizer,
        "Hi",
        sampler=sampler,
        max_tokens=20,
        on_text=segments.append,
    )
    assert text == tokenizer.decode(words)
    assert "".join(segments) == text
    assert len(sampler.calls) == len(words) + 1
    for logprobs in sampler.calls:
        assert logprobs.shape == (1, 49152)
        # Log-probabilities: they exponentiate to a distribution.
        assert abs(mx.logsumexp(logprobs, axis=-1).item()) < 1e-3


def test_max_tokens_stops_generation(embedded_model, week1_model):
    _, tokenizer = embedded_model
    words = tokenizer.encode("Tiny LLM, hi!")
    sampler = ScriptedSampler(words)
    text = tiny.simple_generate(
        week1_model, tokenizer, "Hi", sampler=sampler, max_tokens=2
    )
    assert len(sampler.calls) == 2
    assert text == tokenizer.decode(words[:2])


def test_immediate_eos_gives_empty_text(embedded_model, week1_model):
    _, tokenizer = embedded_model
    eos = next(iter(tokenizer.eos_token_ids))
    segments = []
    text = tiny.simple_generate(
        week1_model,
        tokenizer,
        "Hi",
        sampler=ScriptedSampler([eos]),
        on_text=segments.append,
    )
    assert text == ""
    assert segments == []
