"""Week 3 Day 1: one forward for a whole step, decodes and prefill chunks together.

References: the separate forwards of week 2 (day 5's decode step over the batch
cache, and each chunk through the model with its own cache, as day 7 runs them),
which the mixed step must reproduce logit for logit and cache for cache; and
mlx-lm's own models on each sequence alone, without a cache: random qwen2/llama ones
at unusual sizes (tests/random_models.py) and the embedded SmolLM2 with its weights
dequantized to float32 on both sides.
"""

import re
from dataclasses import dataclass, field

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tiny_llm_base.mlx_lm_reference import chat_ids

from .helpers import FAST_DEVICE_BRANCH, assert_within
from .random_models import SIZES, random_model
from .solution import tiny

pytestmark = pytest.mark.task(1)

# Mixed against separate forwards: the same float32 sums, blocked differently by
# BLAS for a [1, T, E] input than for [B, 1, E] or [1, L, E] ones (measured: ~3e-7
# on random logits of ~0.5, ~5e-5 on the embedded model's logits of ~30).
SAME_FLOAT32_ATOL = {"random": 1e-5, "embedded": 5e-4}
# Against mlx-lm without a cache: random logits ~0.5 (as week 2 day 1), embedded
# logits up to ~40 on the same float32 weights (as week 2 day 5).
MLX_LM_ATOL = {"random": 1e-4, "embedded": 2e-3}
# The embedded model's weights kept 4-bit on both sides ("quantized"): the mixed and
# separate forwards multiply by the same packed weights.
SAME_QUANTIZED_ATOL = 2e-3
DUMMY_TOKEN = 0


@dataclass
class Step:
    """One step's work, described independently of how it is run.

    decoding: slot -> the tokens already in that slot of the batch cache (slots not
    listed are empty); decode_tokens: the token each of the `slots` rows is fed.
    chunks: (the request's tokens already cached, this chunk's tokens, logit_rows: how
    many of its last positions are sampled).
    """

    slots: int
    decoding: dict[int, list[int]]
    decode_tokens: list[int]
    chunks: list[tuple[list[int], list[int], int]] = field(default_factory=list)

    @property
    def decode_offsets(self) -> list[int]:
        if not self.decode_tokens:
            return []
        return [len(self.decoding.get(slot, [])) for slot in range(self.slots)]


def prefilled(model, tokens: list[int]) -> list:
    """A fresh cache per layer holding `tokens`, through the week 2 model."""
    cache = model.create_kv_cache()
    if tokens:
        model(mx.array([tokens]), 0, cache)
    return cache


def build_caches(model, step: Step, max_seq_len: int = 256):
    """(batch cache or None, one cache list per chunk) in the state before the step."""
    batch = None
    if step.slots:
        batch = [
            tiny.BatchingKvCache(step.slots, max_seq_len)
            for _ in range(len(model.create_kv_cache()))
        ]
        for slot, tokens in step.decoding.items():
            for layer, layer_prefilled in zip(batch, prefilled(model, tokens)):
                layer.add_request(layer_prefilled, slot)
    return batch, [prefilled(model, cached) for cached, _, _ in step.chunks]


def run_mixed(model, step: Step):
    batch, caches = build_caches(model, step)
    chunks = [
        tiny.PrefillChunk(tokens, len(cached), cache, rows)
        for (cached, tokens, rows), cache in zip(step.chunks, caches)
    ]
    decode_logits, chunk_logits = tiny.mixed_forward(
        model, step.decode_tokens, step.decode_offsets, batch, chunks
    )
    return decode_logits, chunk_logits, batch, caches


def run_separately(model, step: Step):
    """The week 2 way: one decode forward over the batch cache, one per chunk."""
    batch, caches = build_caches(model, step)
    decode_logits = None
    if step.decode_tokens:
        inputs = mx.array([[token] for token in step.decode_tokens])
        decode_logits = model(inputs, step.decode_offsets, batch)[:, -1, :]
    chunk_logits = [
        model(mx.array([tokens]), len(cached), cache)[0, len(tokens) - rows :, :]
        for (cached, tokens, rows), cache in zip(step.chunks, caches)
    ]
    return decode_logits, chunk_logits, batch, caches


def assert_same_step(model, step: Step, atol: float) -> tuple:
    """Logits and every cache after the mixed step equal the separate forwards';
    returns the mixed step's run (run_mixed), for assert_matches_mlx_lm."""
    mixed = run_mixed(model, step)
    separate = run_separately(model, step)
    decode_logits, chunk_logits, batch, caches = mixed
    expected_decode, expected_chunks, expected_batch, expected_caches = separate
    vocab = model.args.vocab_size
    if step.decode_tokens:
        assert decode_logits.shape == (step.slots, vocab)
        for slot in step.decoding:  # an empty slot's row is a dummy: not compared
            assert_within(
                decode_logits[slot], expected_decode[slot], atol, f"slot {slot}"
            )
    else:
        assert decode_logits is None
    assert len(chunk_logits) == len(step.chunks)
    for number, (logits, expected, (_, _, rows)) in enumerate(
        zip(chunk_logits, expected_chunks, step.chunks)
    ):
        if not rows:
            assert logits is None, f"chunk {number} wants no logits"
            continue
        assert logits.shape == (rows, vocab)
        assert_within(logits, expected, atol, f"chunk {number}")
    for number, (cache, expected) in enumerate(zip(caches, expected_caches)):
        for layer, (ours, theirs) in enumerate(zip(cache, expected)):
            assert ours.offset == theirs.offset
            for name, a, b in zip(("keys", "values"), ours.fetch(), theirs.fetch()):
                assert_within(a, b, atol, f"chunk {number} layer {layer} {name}")
    if step.decoding and step.decode_tokens:
        for layer, (ours, theirs) in enumerate(zip(batch, expected_batch)):
            assert list(ours.offset) == list(theirs.offset)
            for slot, tokens in step.decoding.items():
                length = len(tokens) + 1
                for name in ("keys", "values"):
                    assert_within(
                        getattr(ours, name)[slot, :, :length],
                        getattr(theirs, name)[slot, :, :length],
                        atol,
                        f"batch layer {layer} slot {slot} {name}",
                    )
    return mixed


def assert_matches_mlx_lm(mlx_model, mixed: tuple, step: Step, atol: float) -> None:
    """Each sampled row of the mixed step's run (run_mixed) against mlx-lm's last
    logits for that sequence alone."""
    decode_logits, chunk_logits, _, _ = mixed
    for slot, tokens in step.decoding.items():
        sequence = mx.array([tokens + [step.decode_tokens[slot]]])
        expected = mlx_model(sequence)[0, -1]
        assert_within(decode_logits[slot], expected, atol, f"slot {slot} vs mlx-lm")
    for number, ((cached, tokens, rows), logits) in enumerate(
        zip(step.chunks, chunk_logits)
    ):
        if rows:
            expected = mlx_model(mx.array([cached + tokens]))[0, -rows:]
            assert_within(logits, expected, atol, f"chunk {number} vs mlx-lm")


def tokens(length: int, vocab: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, vocab, length).tolist()


def busy_step(vocab: int) -> Step:
    """Three decoding slots of different lengths and an empty one, and four chunks:
    a whole prompt, a middle chunk (no logits), a last chunk of one token after a
    cached prefix, and a chunk after a long prefix with every position sampled (week
    3 day 4's drafts)."""
    decoding = {0: tokens(9, vocab, 1), 1: tokens(3, vocab, 2), 3: tokens(14, vocab, 3)}
    fed = [tokens(1, vocab, 10 + slot)[0] for slot in range(4)]
    fed[2] = DUMMY_TOKEN
    chunks = [
        ([], tokens(7, vocab, 4), 1),
        (tokens(5, vocab, 5), tokens(4, vocab, 6), 0),
        (tokens(11, vocab, 7), tokens(1, vocab, 8), 1),
        (tokens(20, vocab, 9), tokens(6, vocab, 11), 6),
    ]
    return Step(4, decoding, fed, chunks)


@pytest.fixture(
    scope="module",
    params=range(len(SIZES)),
    ids=lambda i: f"{SIZES[i][0]}-{SIZES[i][1]}",
)
def reference(request):
    return random_model(*SIZES[request.param], seed=request.param)


FAST = pytest.mark.parametrize("fast", [False, True], ids=["hand-written", "mx.fast"])


# --- The layout: one sequence of T tokens, cut into parts ---------------------------


@pytest.mark.parametrize(
    "B, lengths",
    [(3, [4, 1, 6]), (0, [5, 2]), (4, []), (1, [1])],
    ids=["decodes-and-chunks", "chunks-only", "decodes-only", "one-and-one"],
)
def test_split_parts_and_join_parts(B, lengths):
    """[1, H, T, D] -> the decode rows [B, H, 1, D] (token b becomes row b) and
    each chunk's [1, H, L, D], in order; join_parts puts them back as they were."""
    H, D = 3, 5
    x = mx.random.normal((1, H, B + sum(lengths), D))
    expected = np.array(x)
    decode, chunks = tiny.mixed_step.split_parts(x, B, lengths)
    if B:
        assert decode.shape == (B, H, 1, D)
        for row in range(B):
            np.testing.assert_array_equal(
                np.array(decode[row, :, 0]), expected[0, :, row]
            )
    else:
        assert decode is None
    assert len(chunks) == len(lengths)
    start = B
    for length, chunk in zip(lengths, chunks):
        assert chunk.shape == (1, H, length, D)
        np.testing.assert_array_equal(
            np.array(chunk), expected[:, :, start : start + length]
        )
        start += length
    joined = tiny.mixed_step.join_parts(decode, chunks)
    np.testing.assert_array_equal(np.array(joined), expected)


# --- The mixed step against the separate forwards and mlx-lm ------------------------


@FAST_DEVICE_BRANCH
def test_mixed_step_equals_the_separate_forwards(reference, fast):
    model = tiny.Qwen2ModelWeek2(reference, weights="float32", use_fast_kernels=fast)
    step = busy_step(reference.args.vocab_size)
    mixed = assert_same_step(model, step, SAME_FLOAT32_ATOL["random"])
    assert_matches_mlx_lm(reference, mixed, step, MLX_LM_ATOL["random"])


@FAST_DEVICE_BRANCH
def test_decodes_only_and_chunks_only(reference, fast):
    model = tiny.Qwen2ModelWeek2(reference, weights="float32", use_fast_kernels=fast)
    busy = busy_step(reference.args.vocab_size)
    decodes_only = Step(busy.slots, busy.decoding, busy.decode_tokens)
    chunks_only = Step(0, {}, [], busy.chunks)
    for step in (decodes_only, chunks_only):
        mixed = assert_same_step(model, step, SAME_FLOAT32_ATOL["random"])
        assert_matches_mlx_lm(reference, mixed, step, MLX_LM_ATOL["random"])


@FAST_DEVICE_BRANCH
def test_a_long_chunk_beside_decodes(fast):
    """A chunk longer than QUERY_BLOCK after cached tokens (the fast path runs it in
    query blocks on a CPU), next to two decoding slots."""
    reference = random_model(*SIZES[3], seed=3)
    model = tiny.Qwen2ModelWeek2(reference, weights="float32", use_fast_kernels=fast)
    vocab = reference.args.vocab_size
    step = Step(
        2,
        {0: tokens(30, vocab, 1), 1: tokens(4, vocab, 2)},
        [5, 6],
        [(tokens(21, vocab, 3), tokens(150, vocab, 4), 1)],
    )
    mixed = assert_same_step(model, step, SAME_FLOAT32_ATOL["random"])
    assert_matches_mlx_lm(reference, mixed, step, MLX_LM_ATOL["random"])


def test_one_forward_and_logits_only_where_sampled(reference):
    """The projections run once per layer on all T tokens of the step, [1, T, E]; the
    final norm and LM head only on the decode rows and each finishing chunk's last
    position. (Calling the model once per part would pass the other tests.)"""
    model = tiny.Qwen2ModelWeek2(reference, weights="float32")
    step = busy_step(reference.args.vocab_size)
    batch, caches = build_caches(model, step)
    chunks = [
        tiny.PrefillChunk(chunk, len(cached), cache, rows)
        for (cached, chunk, rows), cache in zip(step.chunks, caches)
    ]
    projected, headed = [], []
    for layer in model.layers:

        def recording_project_qkv(x, project_qkv=layer.attention.project_qkv):
            projected.append(tuple(x.shape))
            return project_qkv(x)

        layer.attention.project_qkv = recording_project_qkv

    def recording_logits(h, logits=model.logits):
        headed.append(tuple(h.shape))
        return logits(h)

    model.logits = recording_logits
    tiny.mixed_forward(model, step.decode_tokens, step.decode_offsets, batch, chunks)
    T = step.slots + sum(len(chunk) for _, chunk, _ in step.chunks)
    E = reference.args.hidden_size
    assert projected == [(1, T, E)] * len(model.layers), (
        f"every layer must project the step's {T} tokens at once, got {projected}"
    )
    sampled = step.slots + sum(rows for _, _, rows in step.chunks)
    assert len(headed) == 1 and np.prod(headed[0]) == sampled * E, (
        f"the LM head must see only the {sampled} sampled rows, saw {headed}"
    )


@settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(data=st.data())
def test_random_chunk_splits_match_the_separate_forwards(data):
    """Prompts prefilled over several mixed steps, each cut into random chunks,
    while other requests decode, all in the same caches from step to step: every
    step's logits equal the separate forwards' (run on caches of their own), the
    caches end equal, and each prompt's last chunk gives mlx-lm's logits for the
    whole prompt."""
    index = data.draw(st.integers(0, len(SIZES) - 1), label="model")
    reference = random_model(*SIZES[index], seed=index)
    fast = data.draw(st.booleans(), label="fast")
    model = tiny.Qwen2ModelWeek2(reference, weights="float32", use_fast_kernels=fast)
    token = st.integers(0, reference.args.vocab_size - 1)
    prompts = data.draw(
        st.lists(st.lists(token, min_size=1, max_size=24), min_size=1, max_size=3),
        label="prompts",
    )
    pieces = []
    for prompt in prompts:
        cuts = data.draw(
            st.sets(st.integers(1, len(prompt) - 1), max_size=4)
            if len(prompt) > 1
            else st.just(set()),
            label="cuts",
        )
        bounds = [0, *sorted(cuts), len(prompt)]
        pieces.append(list(zip(bounds, bounds[1:])))
    slots = data.draw(st.integers(1, 3), label="slots")
    in_use = data.draw(st.sets(st.integers(0, slots - 1)), label="slots in use")
    decoding = {
        slot: data.draw(st.lists(token, min_size=1, max_size=12), label="decoding")
        for slot in sorted(in_use)
    }
    start = Step(slots, decoding, [], [([], [], False) for _ in prompts])
    ours, theirs = build_caches(model, start), build_caches(model, start)
    for number in range(max(len(p) for p in pieces)):
        parts = [
            (i, *p[number], p[number][1] == len(prompts[i]))
            for i, p in enumerate(pieces)
            if number < len(p)
        ]
        fed = [
            data.draw(token, label="fed") if slot in decoding else DUMMY_TOKEN
            for slot in range(slots)
        ]
        offsets = [len(decoding.get(slot, [])) for slot in range(slots)]
        fed, offsets = (fed, offsets) if decoding else ([], [])
        batch, caches = ours
        decode_logits, chunk_logits = tiny.mixed_forward(
            model,
            fed,
            offsets,
            batch,
            [
                tiny.PrefillChunk(prompts[i][a:b], a, caches[i], int(wants))
                for i, a, b, wants in parts
            ],
        )
        batch, caches = theirs
        if fed:
            expected = model(mx.array([[t] for t in fed]), offsets, batch)[:, -1]
            for slot in decoding:
                assert_within(
                    decode_logits[slot],
                    expected[slot],
                    SAME_FLOAT32_ATOL["random"],
                    f"step {number} slot {slot}",
                )
        for (i, a, b, wants), logits in zip(parts, chunk_logits):
            expected = model(mx.array([prompts[i][a:b]]), a, caches[i])[:, -1]
            if not wants:
                assert logits is None
                continue
            what = f"step {number} prompt {i}"
            assert_within(logits, expected, SAME_FLOAT32_ATOL["random"], what)
            whole = reference(mx.array([prompts[i]]))[:, -1]
            assert_within(logits, whole, MLX_LM_ATOL["random"], what + " vs mlx-lm")
        decoding = {slot: seq + [fed[slot]] for slot, seq in decoding.items()}
    for i, (mine, other) in enumerate(zip(ours[1], theirs[1])):
        for layer, (a, b) in enumerate(zip(mine, other)):
            assert a.offset == b.offset == len(prompts[i])
            for x, y in zip(a.fetch(), b.fetch()):
                assert_within(x, y, SAME_FLOAT32_ATOL["random"], f"prompt {i} {layer}")
    for layer, (a, b) in enumerate(zip(ours[0], theirs[0])):
        assert list(a.offset) == list(b.offset)
        for slot, sequence in decoding.items():
            n = len(sequence)
            for x, y in [(a.keys, b.keys), (a.values, b.values)]:
                what = f"batch layer {layer} slot {slot}"
                assert_within(
                    x[slot, :, :n], y[slot, :, :n], SAME_FLOAT32_ATOL["random"], what
                )


# --- The embedded model -------------------------------------------------------------


@pytest.fixture(scope="module")
def embedded_step(embedded_model):
    """A step on chat prompts: three decoding requests in four slots, and three chunks."""
    _, tokenizer = embedded_model

    long = chat_ids(
        tokenizer, "Write a short story about a lighthouse keeper and a storm."
    )
    decoding = {
        0: chat_ids(tokenizer, "Hi!"),
        1: chat_ids(tokenizer, "Name two colors."),
        3: chat_ids(tokenizer, "What is 2+2?"),
    }
    fed = [tokenizer.encode(word)[0] for word in ("Hello", "Red", "x", "Four")]
    fed[2] = DUMMY_TOKEN
    chunks = [
        (long[:16], long[16:-1], False),
        (long[:-3], long[-3:], True),
        ([], chat_ids(tokenizer, "What is the capital of France?"), True),
    ]
    return Step(4, decoding, fed, chunks)


@FAST
def test_embedded_model_mixed_step_float32(
    embedded_week2_model, embedded_float32_reference, embedded_step, fast
):
    model = embedded_week2_model(fast)
    mixed = assert_same_step(model, embedded_step, SAME_FLOAT32_ATOL["embedded"])
    assert_matches_mlx_lm(
        embedded_float32_reference, mixed, embedded_step, MLX_LM_ATOL["embedded"]
    )


@FAST
def test_embedded_model_mixed_step_quantized(embedded_model, fast):
    """Packed 4-bit weights (quantized matmul on a CPU is slow: a short step)."""
    mlx_model, tokenizer = embedded_model
    model = tiny.Qwen2ModelWeek2(mlx_model, weights="quantized", use_fast_kernels=fast)
    words = tokenizer.encode("The capital of France is Paris, and of Italy, Rome.")
    step = Step(
        3,
        {0: words[:6], 2: words[3:12]},
        [words[6], DUMMY_TOKEN, words[12]],
        [(words[:4], words[4:9], True), ([], words[2:5], False)],
    )
    assert_same_step(model, step, SAME_QUANTIZED_ATOL)


# --- Bad input ----------------------------------------------------------------------


def test_a_wrong_chunk_offset_names_both_numbers_and_writes_nothing():
    reference = random_model(*SIZES[0], seed=0)
    model = tiny.Qwen2ModelWeek2(reference, weights="float32")
    vocab = reference.args.vocab_size
    step = busy_step(vocab)
    batch, caches = build_caches(model, step)
    chunks = [
        tiny.PrefillChunk(chunk, len(cached), cache, int(wants))
        for (cached, chunk, wants), cache in zip(step.chunks, caches)
    ]
    chunks[3].offset = 19  # its cache holds 20 tokens
    with pytest.raises(ValueError) as error:
        tiny.mixed_forward(
            model, step.decode_tokens, step.decode_offsets, batch, chunks
        )
    message = str(error.value)
    assert re.search(r"\b19\b", message) and re.search(r"\b20\b", message), message
    for (cached, _, _), cache in zip(step.chunks, caches):
        assert [layer.offset for layer in cache] == [len(cached)] * len(cache)
    for layer in batch:
        assert list(layer.offset) == step.decode_offsets


def test_a_wrong_decode_offset_names_both_numbers():
    reference = random_model(*SIZES[2], seed=2)
    model = tiny.Qwen2ModelWeek2(reference, weights="float32")
    step = busy_step(reference.args.vocab_size)
    batch, caches = build_caches(model, step)
    offsets = list(step.decode_offsets)
    offsets[3] += 1  # slot 3 holds 14 tokens
    with pytest.raises(ValueError) as error:
        tiny.mixed_forward(model, step.decode_tokens, offsets, batch, [])
    message = str(error.value)
    assert re.search(r"\b15\b", message) and re.search(r"\b14\b", message), message


def test_bad_inputs_are_refused_in_order_with_the_docstrings_words():
    """mixed_forward checks its inputs before anything runs, in its docstring's
    order, each a ValueError with its docstring's words."""
    reference = random_model(*SIZES[0], seed=0)
    model = tiny.Qwen2ModelWeek2(reference, weights="float32")
    layers = len(model.create_kv_cache())
    batch = [tiny.BatchingKvCache(2, 64) for _ in range(layers)]

    def chunk(tokens: list[int], logit_rows: int):
        return tiny.PrefillChunk(tokens, 0, model.create_kv_cache(), logit_rows)

    empty, too_many_rows = chunk([], 0), chunk([5, 6], 3)
    cases = [
        # (decode tokens, decode offsets, batch cache, chunks, message)
        ([5, 6], [0], None, [empty], "decode tokens need the batch cache their rows live in"),
        ([5, 6], [0], batch, [empty], "2 decode tokens but 1 offsets: one offset per row"),
        ([5], [0], batch, [too_many_rows, empty], "a prefill chunk needs at least one token"),
        ([], [], None, [too_many_rows], "a chunk's logit_rows must be between 0 and its length"),
        ([], [], None, [chunk([5, 6], -1)], "a chunk's logit_rows must be between 0 and its length"),
    ]  # fmt: skip
    for tokens, offsets, batch_cache, chunks, message in cases:
        with pytest.raises(ValueError) as error:
            tiny.mixed_forward(model, tokens, offsets, batch_cache, chunks)
        assert str(error.value) == message
