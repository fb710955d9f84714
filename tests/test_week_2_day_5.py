"""Week 2 Day 5: batched decoding with BatchingKvCache and per-row offsets.

Reference: mlx-lm's own model with its own KV cache (`make_prompt_cache`), decoding
each prompt alone. The batch puts prompts of different lengths side by side, so every
row has its own offset into RoPE and the mask; each row must still give the logits and
greedy tokens of its prompt alone. Models: random mlx-lm qwen2/llama ones, and the
embedded SmolLM2 with its weights dequantized to float32 on both sides.
The mask rule itself is checked against a NumPy mask.
"""

import re

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import make_prompt_cache

from tiny_llm_base.mlx_lm_reference import chat_ids

from .helpers import FAST_DEVICE_BRANCH
from .random_models import SIZES, random_model
from .solution import tiny

# Logits of the random models are O(1) and those of the embedded model O(10): the two
# sides add the same float32 numbers in different orders.
RANDOM_ATOL = 1e-4
EMBEDDED_ATOL = 2e-3
DUMMY_TOKEN = 0  # what an empty slot is fed


def decode_alone(mlx_model, prompt: list[int], steps: int):
    """Greedy decoding of one prompt by mlx-lm: (tokens [steps], logits [steps + 1, V]).

    logits[0] follows the prompt, logits[t] follows feeding tokens[t - 1].
    """
    cache = make_prompt_cache(mlx_model)
    logits = mlx_model(mx.array([prompt]), cache=cache)[0, -1]
    rows, tokens = [np.array(logits)], []
    for _ in range(steps):
        tokens.append(int(rows[-1].argmax()))
        logits = mlx_model(mx.array([[tokens[-1]]]), cache=cache)[0, -1]
        rows.append(np.array(logits))
    return tokens, np.stack(rows)


class Batch:
    """Drives a model over one BatchingKvCache per layer, as the scheduler will.

    The test keeps its own record of each slot's next token and offset.
    """

    def __init__(self, model, slots: int, max_seq_len: int):
        self.model = model
        self.cache = [
            tiny.BatchingKvCache(slots, max_seq_len) for _ in model.create_kv_cache()
        ]
        self.next_tokens: list[int | None] = [None] * slots
        self.offsets = [0] * slots

    def add(self, slot: int, prompt: list[int]) -> np.ndarray:
        """Prefill the prompt in its own cache, copy it into `slot`: last logits [V]."""
        prefilled = self.model.create_kv_cache()
        logits = np.array(self.model(mx.array([prompt]), 0, prefilled)[0, -1])
        for layer, layer_prefilled in zip(self.cache, prefilled):
            layer.add_request(layer_prefilled, slot)
        self.next_tokens[slot] = int(logits.argmax())
        self.offsets[slot] = len(prompt)
        return logits

    def remove(self, slot: int) -> None:
        for layer in self.cache:
            layer.remove_request(slot)
        self.next_tokens[slot] = None
        self.offsets[slot] = 0

    def step(self) -> tuple[list[int | None], np.ndarray]:
        """One decode step for every slot: (the tokens fed, logits [slots, V])."""
        fed = list(self.next_tokens)
        inputs = mx.array([[DUMMY_TOKEN if t is None else t] for t in fed])
        logits = np.array(self.model(inputs, list(self.offsets), self.cache)[:, -1])
        for slot, token in enumerate(fed):
            if token is not None:
                self.next_tokens[slot] = int(logits[slot].argmax())
                self.offsets[slot] += 1
        return fed, logits


def decode_together(model, prompts: dict[int, list[int]], slots, steps, max_seq_len):
    """Prompts by slot, decoded as one batch.

    Returns slot -> (tokens [steps], logits [steps + 1, V]), as decode_alone does.
    """
    batch = Batch(model, slots, max_seq_len)
    rows = {slot: [batch.add(slot, prompt)] for slot, prompt in prompts.items()}
    tokens = {slot: [] for slot in prompts}
    for _ in range(steps):
        fed, logits = batch.step()
        assert np.isfinite(logits).all()
        for slot in prompts:
            tokens[slot].append(fed[slot])
            rows[slot].append(logits[slot])
    return {slot: (tokens[slot], np.stack(rows[slot])) for slot in prompts}


def random_prompt(length: int, vocab: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, vocab, length).tolist()


@pytest.fixture(
    scope="module",
    params=range(len(SIZES)),
    ids=lambda i: f"{SIZES[i][0]}-{SIZES[i][1]}",
)
def reference(request):
    return random_model(*SIZES[request.param], seed=request.param)


@pytest.mark.task(2)
@FAST_DEVICE_BRANCH
def test_batch_matches_each_prompt_alone(reference, fast):
    model = tiny.Qwen2ModelWeek2(reference, weights="float32", use_fast_kernels=fast)
    vocab = reference.args.vocab_size
    # Three lengths, so three offsets; slot 2 stays empty all along.
    prompts = {
        0: random_prompt(9, vocab, 1),
        1: random_prompt(4, vocab, 2),
        3: random_prompt(13, vocab, 3),
    }
    steps = 5
    together = decode_together(model, prompts, slots=4, steps=steps, max_seq_len=24)
    for slot, prompt in prompts.items():
        expected_tokens, expected_logits = decode_alone(reference, prompt, steps)
        tokens, logits = together[slot]
        assert tokens == expected_tokens, f"slot {slot}: greedy tokens differ"
        np.testing.assert_allclose(logits, expected_logits, atol=RANDOM_ATOL, rtol=0)


@pytest.fixture(scope="module")
def embedded_float32(embedded_model, embedded_week2_model, embedded_float32_reference):
    """(reference, model, tokenizer): mlx-lm's model on the embedded weights
    dequantized to float32, and Qwen2ModelWeek2 dequantizing them itself."""
    return embedded_float32_reference, embedded_week2_model(False), embedded_model[1]


@pytest.mark.task(2)
def test_embedded_model_batch_matches_each_prompt_alone(embedded_float32):
    reference, model, tokenizer = embedded_float32
    questions = ["Hi!", "What is the capital of France?", "Name two colors."]
    prompts = {slot: chat_ids(tokenizer, q) for slot, q in enumerate(questions)}
    assert len({len(p) for p in prompts.values()}) == 3
    steps = 4
    together = decode_together(model, prompts, slots=3, steps=steps, max_seq_len=64)
    for slot, prompt in prompts.items():
        expected_tokens, expected_logits = decode_alone(reference, prompt, steps)
        tokens, logits = together[slot]
        assert tokens == expected_tokens, f"{questions[slot]!r}: greedy tokens differ"
        np.testing.assert_allclose(logits, expected_logits, atol=EMBEDDED_ATOL, rtol=0)


def numpy_batch_mask(offsets, L, S):
    """[B, 1, L, S]: row b's query i sees key j iff j <= offsets[b] + i."""
    query = np.asarray(offsets)[:, None, None] + np.arange(L)[None, :, None]
    key = np.arange(S)[None, None, :]
    return np.where(key <= query, 0.0, -np.inf)[:, None]


@pytest.mark.task(1)
@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16])
@pytest.mark.parametrize(
    "offsets, L, S", [([0, 3, 7], 1, 8), ([5, 0, 2, 9], 4, 13), ([6], 3, 11)]
)
def test_batch_causal_mask_matches_numpy(offsets, L, S, dtype):
    mask = tiny.kv_cache.batch_causal_mask(mx.array(offsets), L, S, dtype)
    assert mask.shape == (len(offsets), 1, L, S)
    assert mask.dtype == dtype
    np.testing.assert_array_equal(
        np.array(mask.astype(mx.float32)), numpy_batch_mask(offsets, L, S)
    )


@pytest.mark.task(2)
@FAST_DEVICE_BRANCH
def test_empty_slots_give_finite_logits_in_every_row(fast):
    reference = random_model(*SIZES[0], seed=0)
    model = tiny.Qwen2ModelWeek2(reference, weights="float32", use_fast_kernels=fast)
    batch = Batch(model, slots=4, max_seq_len=16)
    _, logits = batch.step()  # every slot empty
    assert np.isfinite(logits).all()
    prompt = random_prompt(6, reference.args.vocab_size, 4)
    batch.add(2, prompt)
    for layer in batch.cache:
        assert list(layer.offset) == [0, 0, 6, 0]
    expected_tokens, expected_logits = decode_alone(reference, prompt, 3)
    for step in range(3):
        fed, logits = batch.step()
        assert np.isfinite(logits).all(), f"step {step}: NaN or inf in some row"
        assert fed[2] == expected_tokens[step]
        np.testing.assert_allclose(
            logits[2], expected_logits[step + 1], atol=RANDOM_ATOL, rtol=0
        )
    for layer in batch.cache:
        assert list(layer.offset) == [0, 0, 9, 0]  # empty slots stay at offset 0


@pytest.mark.task(2)
@pytest.mark.parametrize("size", [0, 2], ids=lambda i: f"{SIZES[i][0]}-{SIZES[i][1]}")
def test_removed_request_leaves_every_layer(size):
    reference = random_model(*SIZES[size], seed=size)
    model = tiny.Qwen2ModelWeek2(reference, weights="float32")
    vocab = reference.args.vocab_size
    removed, staying = random_prompt(10, vocab, 5), random_prompt(5, vocab, 6)
    batch = Batch(model, slots=2, max_seq_len=24)
    batch.add(0, removed)
    batch.add(1, staying)
    for _ in range(2):
        batch.step()
    batch.remove(0)
    for number, layer in enumerate(batch.cache):
        assert list(layer.offset) == [0, 7], f"layer {number} still holds the request"
    expected_tokens, expected_logits = decode_alone(reference, staying, 5)
    # The freed slot now runs the dummy token at position 0: if it still saw the
    # removed request's keys, its logits would not be those of that token alone.
    dummy_alone = np.array(reference(mx.array([[DUMMY_TOKEN]]))[0, -1])
    for step in range(2, 5):
        fed, logits = batch.step()
        np.testing.assert_allclose(logits[0], dummy_alone, atol=RANDOM_ATOL, rtol=0)
        assert fed[1] == expected_tokens[step]
        np.testing.assert_allclose(
            logits[1], expected_logits[step + 1], atol=RANDOM_ATOL, rtol=0
        )


@pytest.mark.task(2)
@FAST_DEVICE_BRANCH
@pytest.mark.parametrize("size", [1, 3], ids=lambda i: f"{SIZES[i][0]}-{SIZES[i][1]}")
def test_reused_slot_never_sees_the_previous_keys(size, fast):
    reference = random_model(*SIZES[size], seed=size)
    model = tiny.Qwen2ModelWeek2(reference, weights="float32", use_fast_kernels=fast)
    vocab = reference.args.vocab_size
    # The old request is longer than the new one, so its stale keys sit at positions
    # the new row reaches: only the new row's own offset keeps them out.
    old, other, new = (
        random_prompt(14, vocab, 7),
        random_prompt(6, vocab, 8),
        random_prompt(4, vocab, 9),
    )
    batch = Batch(model, slots=2, max_seq_len=32)
    batch.add(0, old)
    batch.add(1, other)
    for _ in range(3):
        batch.step()
    batch.remove(0)
    first_logits = batch.add(0, new)
    expected_tokens, expected_logits = decode_alone(reference, new, 4)
    np.testing.assert_allclose(first_logits, expected_logits[0], atol=RANDOM_ATOL)
    other_tokens, other_logits = decode_alone(reference, other, 7)
    for step in range(4):
        fed, logits = batch.step()
        assert fed[0] == expected_tokens[step]
        np.testing.assert_allclose(
            logits[0], expected_logits[step + 1], atol=RANDOM_ATOL, rtol=0
        )
        assert fed[1] == other_tokens[step + 3]
        np.testing.assert_allclose(
            logits[1], other_logits[step + 4], atol=RANDOM_ATOL, rtol=0
        )


@pytest.mark.task(2)
def test_a_row_offset_that_is_not_its_cache_length_names_both_numbers():
    """Each row's offset must be its own count in the batch cache (an empty slot
    runs a dummy token, at offset 0 here); a wrong one is refused before any layer's
    cache is written."""
    reference = random_model(*SIZES[0], seed=0)
    model = tiny.Qwen2ModelWeek2(reference, weights="float32")
    vocab = reference.args.vocab_size
    batch = Batch(model, slots=3, max_seq_len=32)
    batch.add(0, random_prompt(11, vocab, 10))
    batch.add(2, random_prompt(17, vocab, 11))
    for layer in batch.cache:
        assert isinstance(layer.offset, list), "BatchingKvCache.offset: one per row"
    inputs = mx.array([[1], [DUMMY_TOKEN], [2]])
    with pytest.raises(ValueError) as error:
        model(inputs, [11, 0, 16], batch.cache)
    message = str(error.value)
    assert re.search(r"\b16\b", message) and re.search(r"\b17\b", message), (
        f"the message must name row 2's offset given (16) and held (17): {message!r}"
    )
    for layer in batch.cache:
        assert list(layer.offset) == [11, 0, 17]
    batch.step()  # the right offsets still work
    for layer in batch.cache:
        assert list(layer.offset) == [12, 0, 18]


@pytest.mark.task(2)
def test_max_seq_len_is_enforced():
    model = tiny.Qwen2ModelWeek2(random_model(*SIZES[0], seed=0), weights="float32")
    batch = Batch(model, slots=2, max_seq_len=6)
    with pytest.raises(ValueError):
        batch.add(0, list(range(7)))
    batch.add(1, list(range(5)))
    batch.step()  # the sixth position: the cache is now full
    with pytest.raises(ValueError):
        batch.step()
