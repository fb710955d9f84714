"""Week 2 Day 1: the KV cache, and a model that runs only the new tokens.

References: for the cache, numpy bookkeeping written here (what was stored, in
order); for the model, mlx-lm's own qwen2/llama models run on the whole sequence at
once, without any cache: random ones at unusual sizes (tests/random_models.py) and
the embedded SmolLM2; for generation, mlx_lm.generate on its float32 copy.
"""

import functools
import itertools
import math
import re

import mlx.core as mx
import mlx_lm
import numpy as np
import pytest
from mlx import nn
from mlx.utils import tree_map
from mlx_lm.models import llama
from mlx_lm.sample_utils import make_sampler as mlx_lm_make_sampler

from .helpers import assert_within
from .random_models import random_models
from tiny_llm_base.mlx_lm_reference import chat_ids

from .solution import tiny

# Absolute, on logits of size ~0.5 (random models): float32 only reorders sums;
# bfloat16 rounds every activation to 8 bits of mantissa.
TOLERANCE = {mx.float32: 1e-4, mx.bfloat16: 2e-2}
# The embedded model: mlx-lm multiplies by its 4-bit weights directly, this model by
# the same weights dequantized to float32; logits span about +-40 (as in week 1).
EMBEDDED_LOGIT_ATOL = 0.3
# The embedded model against mlx-lm's on the same float32 weights (logits up to ~40):
# the two only add the same float32 numbers in different orders.
EMBEDDED_FLOAT32_ATOL = 2e-3

# How a sequence of 11 tokens is fed: a prompt, then one token per step; or chunks.
PREFILL_THEN_DECODE = [5, 1, 1, 1, 1, 1, 1]
CHUNKS = [4, 3, 1, 3]


def feed(model, inputs: mx.array, lengths: list[int], cache=None) -> mx.array:
    """Run inputs [B, T] through the model in pieces of `lengths` tokens, each at
    its int offset, through one cache; return the logits of all T positions."""
    cache = model.create_kv_cache() if cache is None else cache
    logits, offset = [], 0
    for length in lengths:
        logits.append(model(inputs[:, offset : offset + length], offset, cache))
        offset += length
    assert offset == inputs.shape[1]
    return mx.concatenate(logits, axis=1)


# Same shape and dtype, and |actual - expected| <= atol.
assert_close = functools.partial(assert_within, same_dtype=True)


# --- The cache itself -------------------------------------------------------------


@pytest.mark.task(1)
@pytest.mark.parametrize(
    "dtype", [mx.float32, mx.bfloat16], ids=["float32", "bfloat16"]
)
def test_full_cache_returns_everything_stored_so_far(dtype):
    cache = tiny.TinyKvFullCache()
    assert cache.offset == 0
    B, H, D = 2, 3, 5
    stored_keys, stored_values = [], []
    for length in [4, 1, 1, 3, 1, 2]:
        keys = mx.random.normal((B, H, length, D)).astype(dtype)
        values = mx.random.normal((B, H, length, D)).astype(dtype)
        stored_keys.append(np.array(keys.astype(mx.float32)))
        stored_values.append(np.array(values.astype(mx.float32)))
        all_keys, all_values, mask = cache.update_and_fetch(keys, values)
        total = sum(k.shape[2] for k in stored_keys)
        assert cache.offset == total
        assert all_keys.shape == all_values.shape == (B, H, total, D)
        assert all_keys.dtype == all_values.dtype == dtype
        np.testing.assert_array_equal(
            np.array(all_keys.astype(mx.float32)), np.concatenate(stored_keys, axis=2)
        )
        np.testing.assert_array_equal(
            np.array(all_values.astype(mx.float32)),
            np.concatenate(stored_values, axis=2),
        )
        if length > 1:
            assert isinstance(mask, str) and mask == "causal"
        else:
            assert mask is None  # one query, at the end: it sees every key


@pytest.mark.task(1)
def test_full_cache_takes_a_prompt_longer_than_its_first_allocation():
    cache = tiny.TinyKvFullCache()
    keys = mx.random.normal((1, 2, 700, 4))
    cache.update_and_fetch(keys, -keys)
    assert cache.offset == 700 and cache.capacity() >= 700
    step = mx.random.normal((1, 2, 1, 4))
    all_keys, all_values, _ = cache.update_and_fetch(step, -step)
    expected = np.concatenate([np.array(keys), np.array(step)], axis=2)
    np.testing.assert_array_equal(np.array(all_keys), expected)
    np.testing.assert_array_equal(np.array(all_values), -expected)


@pytest.mark.task(1)
def test_full_cache_grows_geometrically():
    """Doubling (or any constant factor) reallocates O(log n) times, so the copies
    add up to O(n); growing by a fixed step would copy O(n^2) over a generation."""
    steps = 2000
    cache = tiny.TinyKvFullCache()
    capacities = [cache.capacity()]
    for step in range(steps):
        token = mx.full((1, 2, 1, 3), step, mx.float32)
        keys, values, _ = cache.update_and_fetch(token, -token)
        mx.eval(keys, values)
        capacities.append(cache.capacity())
        assert cache.capacity() >= cache.offset == step + 1
    growths = [(a, b) for a, b in itertools.pairwise(capacities) if a != b]
    assert all(b > a for a, b in growths), "the capacity must never shrink"
    assert all(b >= 1.5 * a for a, b in growths if a > 0), (
        f"capacities {[b for _, b in growths]}: each reallocation must multiply the "
        "capacity by a constant factor (the reference doubles it)"
    )
    assert len(growths) <= math.ceil(math.log(steps, 1.5))
    expected = np.broadcast_to(np.arange(steps, dtype=np.float32)[:, None], (steps, 3))
    np.testing.assert_array_equal(np.array(keys[0, 1]), expected)
    np.testing.assert_array_equal(np.array(values[0, 0]), -expected)


# --- The model with a cache against mlx-lm without one ------------------------------


def llama_with_attention_biases() -> nn.Module:
    """A Llama with biases on q, k, v *and* o (attention_bias=True)."""
    args = llama.ModelArgs(
        model_type="llama",
        hidden_size=80,
        num_hidden_layers=2,
        intermediate_size=112,
        num_attention_heads=5,
        num_key_value_heads=1,
        rms_norm_eps=1e-6,
        vocab_size=131,
        attention_bias=True,
        tie_word_embeddings=False,
    )
    model = llama.Model(args)
    mx.random.seed(7)
    model.update(
        tree_map(lambda p: 0.1 * mx.random.normal(p.shape), model.parameters())
    )
    mx.eval(model.parameters())
    return model


@pytest.mark.task(2)
@pytest.mark.parametrize(
    "dtype", [mx.float32, mx.bfloat16], ids=["float32", "bfloat16"]
)
@pytest.mark.parametrize(
    "lengths", [PREFILL_THEN_DECODE, CHUNKS], ids=["prefill-decode", "chunks"]
)
def test_cached_steps_match_mlx_lm_on_the_whole_sequence(dtype, lengths):
    for reference in random_models(dtype):
        model = tiny.Qwen2ModelWeek2(reference, weights="float32")
        inputs = mx.random.randint(0, reference.args.vocab_size, (2, 11))
        assert_close(feed(model, inputs, lengths), reference(inputs), TOLERANCE[dtype])


@pytest.mark.task(2)
def test_llama_attention_biases_are_used():
    reference = llama_with_attention_biases()
    model = tiny.Qwen2ModelWeek2(reference, weights="float32")
    inputs = mx.random.randint(0, 131, (1, 9))
    expected = reference(inputs)
    assert_close(feed(model, inputs, [6, 1, 1, 1]), expected, TOLERANCE[mx.float32])


@pytest.mark.task(2)
def test_one_cache_per_layer_each_at_the_sequence_length():
    reference = random_models()[1]
    model = tiny.Qwen2ModelWeek2(reference, weights="float32")
    cache = model.create_kv_cache()
    assert len(cache) == reference.args.num_hidden_layers
    assert all(layer.offset == 0 for layer in cache)
    feed(model, mx.random.randint(0, 100, (1, 8)), [5, 1, 2], cache)
    assert [layer.offset for layer in cache] == [8] * len(cache)


@pytest.mark.task(2)
def test_a_list_offset_gives_each_row_its_position():
    reference = random_models()[0]
    model = tiny.Qwen2ModelWeek2(reference, weights="float32")
    inputs = mx.random.randint(0, reference.args.vocab_size, (2, 7))
    cache = model.create_kv_cache()
    model(inputs[:, :4], [0, 0], cache)
    last = model(inputs[:, 4:], [4, 4], cache)
    assert_close(last, reference(inputs)[:, 4:], TOLERANCE[mx.float32])


@pytest.mark.task(2)
@pytest.mark.parametrize("wrong", [12, 14, [13, 12]], ids=["behind", "ahead", "row"])
def test_an_offset_that_is_not_the_cache_length_names_both_numbers(wrong):
    """RoPE takes the offset it is given, the mask comes from the cache's own count:
    when they differ the model must refuse before it writes into any layer's cache."""
    reference = random_models()[0]
    model = tiny.Qwen2ModelWeek2(reference, weights="float32")
    inputs = mx.random.randint(0, reference.args.vocab_size, (2, 14))
    cache = model.create_kv_cache()
    model(inputs[:, :13], 0, cache)
    with pytest.raises(ValueError) as error:
        model(inputs[:, 13:], wrong, cache)
    message = str(error.value)
    given = wrong if isinstance(wrong, int) else wrong[1]
    assert re.search(rf"\b{given}\b", message) and re.search(r"\b13\b", message), (
        f"the message must name the offset given ({given}) and the cache's (13): "
        f"{message!r}"
    )
    assert [layer.offset for layer in cache] == [13] * len(cache)
    last = model(inputs[:, 13:], 13, cache)  # the right offset still works
    assert_close(last, reference(inputs)[:, 13:], TOLERANCE[mx.float32])


@pytest.mark.task(2)
@pytest.mark.parametrize("lengths", [[11], [4, 7]], ids=["whole", "chunks"])
def test_last_position_only_gives_mlx_lm_last_logits(lengths):
    """A prefill chunk samples only after its last token: [B, 1, V], mlx-lm's last row.
    (Week 2 Day 3 runs the same check on the fast kernels.)"""
    check_last_position_only(lengths, fast=False)


def check_last_position_only(lengths: list[int], fast: bool):
    for reference in random_models():
        model = tiny.Qwen2ModelWeek2(
            reference, weights="float32", use_fast_kernels=fast
        )
        inputs = mx.random.randint(0, reference.args.vocab_size, (2, sum(lengths)))
        cache, offset = model.create_kv_cache(), 0
        for length in lengths:
            chunk = inputs[:, offset : offset + length]
            last = model(chunk, offset, cache, last_position_only=True)
            offset += length
            assert last.shape == (2, 1, reference.args.vocab_size)
            expected = reference(inputs[:, :offset])[:, -1:, :]
            assert_close(last, expected, TOLERANCE[mx.float32])
        assert [layer.offset for layer in cache] == [offset] * len(cache)


# --- The embedded model -----------------------------------------------------------


@pytest.fixture(scope="module")
def embedded_week2(embedded_model, embedded_week2_model):
    """(Qwen2ModelWeek2 with float32 weights, mlx-lm model, tokenizer)."""
    mlx_model, tokenizer = embedded_model
    return embedded_week2_model(False), mlx_model, tokenizer


@pytest.mark.task(2)
def test_embedded_model_prefill_then_decode_matches_mlx_lm(embedded_week2):
    model, mlx_model, tokenizer = embedded_week2
    ids = tokenizer.encode(
        "The capital of France is Paris, and the capital of Italy is"
    )
    inputs = mx.array(ids)[None]
    expected = mlx_model(inputs)
    prompt = len(ids) - 5
    actual = feed(model, inputs, [prompt, 1, 1, 1, 1, 1])
    assert actual.dtype == mx.float32
    assert_close(actual, expected, EMBEDDED_LOGIT_ATOL)
    chunked = feed(model, inputs, [3, prompt - 3, 2, 3])
    assert_close(chunked, expected, EMBEDDED_LOGIT_ATOL)


@pytest.mark.task(2)
def test_embedded_model_last_position_only_matches_mlx_lm_float32(
    embedded_week2, embedded_week2_model, embedded_float32_reference
):
    """On the same float32 weights as mlx-lm's model: a prompt prefilled in two
    chunks, each giving only its last position's logits. (Week 2 Day 3 runs the
    same check on the fast kernels.)"""
    _, _, tokenizer = embedded_week2
    check_embedded_last_position(
        tokenizer, embedded_week2_model(False), embedded_float32_reference
    )


def check_embedded_last_position(tokenizer, model, float32_reference):
    ids = tokenizer.encode(
        "The capital of France is Paris, and the capital of Italy is"
    )
    inputs = mx.array(ids)[None]
    cache = model.create_kv_cache()
    split = len(ids) // 2
    first = model(inputs[:, :split], 0, cache, last_position_only=True)
    last = model(inputs[:, split:], split, cache, last_position_only=True)
    for actual, end in [(first, split), (last, len(ids))]:
        expected = float32_reference(inputs[:, :end])[:, -1:, :]
        assert_close(actual, expected, EMBEDDED_FLOAT32_ATOL)


GENERATION_PROMPTS = ["What is the capital of France?", "Write a haiku about the sea."]
MAX_TOKENS = 16


@pytest.mark.task(3)
@pytest.mark.parametrize("prompt", GENERATION_PROMPTS)
def test_generate_with_kv_cache_matches_mlx_lm_greedy(
    embedded_week2, embedded_float32_reference, prompt
):
    """Against mlx-lm's model holding the same float32 weights as ours (its
    quantized original took ~3x longer a token on the CPU, quantized matmuls)."""
    model, _, tokenizer = embedded_week2
    segments = []
    ours = tiny.simple_generate_with_kv_cache(
        model,
        tokenizer,
        prompt,
        sampler=tiny.make_sampler(0.0),
        max_tokens=MAX_TOKENS,
        on_text=segments.append,
    )
    prompt_ids = chat_ids(tokenizer, prompt)
    expected = mlx_lm.generate(
        embedded_float32_reference,
        tokenizer,
        prompt_ids,
        max_tokens=MAX_TOKENS,
        sampler=mlx_lm_make_sampler(temp=0.0),
    )
    assert ours == expected
    assert len(ours) > 0
    assert all(segments) and "".join(segments) == ours
