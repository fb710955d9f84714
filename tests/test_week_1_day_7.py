"""Week 1 Day 7: sampling. Each sampler runs on many identical rows at once ([B, V]
with large B), and the empirical frequencies are compared with the distribution
computed here in numpy: softmax(logits / temp), cut to the top k, then to the top p.
"""

import mlx.core as mx
import numpy as np
import pytest

from .solution import tiny

SAMPLES = 20000
FREQUENCY_ATOL = 0.02  # about 7 standard deviations of a frequency at 20000 samples


def log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def expected_distribution(logits, temp, top_p=1.0, top_k=None) -> np.ndarray:
    """logits: [V] -> the probabilities a sampler should draw from, by definition."""
    probs = np.exp(log_softmax(logits / temp))
    order = np.argsort(-probs)
    keep = np.zeros(len(probs), dtype=bool)
    candidates = order if top_k is None else order[:top_k]
    total = probs[candidates].sum()
    mass = 0.0
    for token in candidates:  # smallest prefix whose renormalized mass reaches top_p
        keep[token] = True
        mass += probs[token] / total
        if mass >= top_p:
            break
    kept = np.where(keep, probs, 0.0)
    return kept / kept.sum()


def sample_many(sampler, logits: np.ndarray) -> np.ndarray:
    logprobs = mx.array(np.broadcast_to(log_softmax(logits), (SAMPLES, len(logits))))
    tokens = sampler(logprobs)
    assert tokens.shape == (SAMPLES,)
    return np.array(tokens)


def frequencies(tokens: np.ndarray, vocab: int) -> np.ndarray:
    return np.bincount(tokens, minlength=vocab) / len(tokens)


def random_logits(vocab: int, seed: int, spread: float = 1.5) -> np.ndarray:
    return (spread * np.random.default_rng(seed).standard_normal(vocab)).astype(
        np.float32
    )


@pytest.mark.task(1)
def test_greedy_is_argmax():
    logprobs = mx.random.normal((7, 97))
    tokens = tiny.make_sampler(0.0)(logprobs)
    assert tokens.shape == (7,)
    np.testing.assert_array_equal(np.array(tokens), np.array(logprobs).argmax(axis=-1))


@pytest.mark.task(1)
def test_greedy_ignores_top_p_and_top_k():
    logprobs = mx.random.normal((5, 31))
    tokens = tiny.make_sampler(0.0, top_p=0.3, top_k=2)(logprobs)
    np.testing.assert_array_equal(np.array(tokens), np.array(logprobs).argmax(axis=-1))


@pytest.mark.task(1)
@pytest.mark.parametrize("temp", [0.5, 1.0, 2.0])
def test_temperature_frequencies(temp):
    logits = random_logits(9, seed=1)
    tokens = sample_many(tiny.make_sampler(temp), logits)
    np.testing.assert_allclose(
        frequencies(tokens, 9), expected_distribution(logits, temp), atol=FREQUENCY_ATOL
    )


@pytest.mark.task(1)
def test_low_temperature_concentrates_on_the_best_token():
    logits = random_logits(40, seed=2)
    tokens = sample_many(tiny.make_sampler(0.05), logits)
    assert (tokens == logits.argmax()).mean() > 0.99


@pytest.mark.task(2)
@pytest.mark.parametrize("top_k", [1, 3, 7])
def test_top_k_keeps_only_k_candidates(top_k):
    logits = random_logits(50, seed=3, spread=0.8)
    tokens = sample_many(tiny.make_sampler(1.0, top_k=top_k), logits)
    top = set(np.argsort(-logits)[:top_k].tolist())
    assert set(tokens.tolist()) == top
    np.testing.assert_allclose(
        frequencies(tokens, 50),
        expected_distribution(logits, 1.0, top_k=top_k),
        atol=FREQUENCY_ATOL,
    )


@pytest.mark.task(2)
def test_top_k_larger_than_vocab_keeps_everything():
    logits = random_logits(6, seed=4)
    tokens = sample_many(tiny.make_sampler(1.0, top_k=100), logits)
    np.testing.assert_allclose(
        frequencies(tokens, 6), expected_distribution(logits, 1.0), atol=FREQUENCY_ATOL
    )


@pytest.mark.task(3)
@pytest.mark.parametrize("top_p", [0.1, 0.5, 0.9])
def test_top_p_keeps_the_smallest_set_reaching_p(top_p):
    logits = random_logits(30, seed=5)
    tokens = sample_many(tiny.make_sampler(1.0, top_p=top_p), logits)
    expected = expected_distribution(logits, 1.0, top_p=top_p)
    assert set(tokens.tolist()) <= set(np.flatnonzero(expected).tolist())
    np.testing.assert_allclose(frequencies(tokens, 30), expected, atol=FREQUENCY_ATOL)


@pytest.mark.task(3)
def test_top_p_always_keeps_the_best_token():
    logits = np.array([0.0, 3.0, 1.0, 2.0], dtype=np.float32)
    tokens = sample_many(tiny.make_sampler(1.0, top_p=0.01), logits)
    assert (tokens == 1).all()


@pytest.mark.task(3)
def test_temperature_top_k_and_top_p_together():
    logits = random_logits(40, seed=6)
    sampler = tiny.make_sampler(0.7, top_p=0.8, top_k=6)
    tokens = sample_many(sampler, logits)
    expected = expected_distribution(logits, 0.7, top_p=0.8, top_k=6)
    np.testing.assert_allclose(frequencies(tokens, 40), expected, atol=FREQUENCY_ATOL)


@pytest.mark.task(3)
def test_rows_are_sampled_from_their_own_distribution():
    # Row r puts almost all its mass on token r.
    logprobs = mx.array(log_softmax(20.0 * np.eye(5, dtype=np.float32)))
    for sampler in (tiny.make_sampler(1.0), tiny.make_sampler(1.0, top_p=0.9, top_k=2)):
        np.testing.assert_array_equal(np.array(sampler(logprobs)), np.arange(5))


@pytest.mark.task(1)
@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"temp": -0.1}, "temp"),
        ({"temp": 1.0, "top_p": 0.0}, "top_p"),
        ({"temp": 1.0, "top_p": 1.5}, "top_p"),
        ({"temp": 1.0, "top_p": -0.2}, "top_p"),
        ({"temp": 1.0, "top_k": 0}, "top_k"),
        ({"temp": 1.0, "top_k": -3}, "top_k"),
        ({"temp": float("nan")}, "temp"),
        ({"temp": float("inf")}, "temp"),
        ({"temp": 1.0, "top_p": float("nan")}, "top_p"),
        ({"temp": 1.0, "top_k": 2.5}, "top_k"),
        ({"temp": 1.0, "top_k": True}, "top_k"),
    ],
)
def test_invalid_arguments_raise(kwargs, message):
    with pytest.raises(ValueError, match=message):
        tiny.make_sampler(**kwargs)
