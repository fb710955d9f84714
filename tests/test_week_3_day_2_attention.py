"""Week 3 Day 2: decode rows that attend by length, and the pool in 8 or 4 bits.

group_rows cuts the decode rows into groups of similar length (checked against the
rule as the chapter states it, on random lengths); the batch view's attend_staged
gives every row what mx.fast's attention gives it over its own keys alone, and
gathers each group only to its own longest row; the engine's tokens are mlx-lm's
with every row in its own group. Quantized rows decode within one quantization step
of what was written, float16 rows as a cast gives them (on the CPU's side of the
device switch, subnormals as zeros); a float16 or quantized pool's engine gives
mlx-lm's greedy tokens with mlx-lm keeping its keys and values the same way (a
float16 KVCache, its own QuantizedKVCache of the same mx.quantize groups), and its
budget holds the tokens that its bytes a token say.
"""

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tiny_llm_base.device import PATHS_VARIABLE
from tiny_llm_base.memory import KV_GROUP_SIZE
from tiny_llm_base.mlx_lm_reference import mlx_lm_greedy

from .helpers import assert_like_mlx_lm, assert_same_tokens, token_ids
from .paged_checks import assert_pool_empty, run_engine
from .solution import tiny


def paged_engine(model, tokenizer, **settings):
    return tiny.Engine(
        model, tokenizer, kv_cache="paged", prefix_caching=False, **settings
    )


# --- group_rows ---------------------------------------------------------------------


@pytest.mark.task(3)
@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 3000), min_size=1, max_size=12),
    call_positions=st.sampled_from([0, 1, 64, 256, 5000]),
)
def test_group_rows_follows_the_rule(lengths, call_positions):
    """Every row in exactly one group, each group's indexes ascending; taken longest
    first, a row joins the group before it exactly when that group's longest row is
    at most call_positions longer."""
    groups = tiny.group_rows(lengths, call_positions)
    rows = [b for group in groups for b in group]
    assert sorted(rows) == list(range(len(lengths)))
    assert all(group == sorted(group) for group in groups)
    longest = [max(lengths[b] for b in group) for group in groups]
    assert longest == sorted(longest, reverse=True), "groups come longest first"
    for group, top in zip(groups, longest):
        assert all(top - lengths[b] <= call_positions for b in group)
    for before, after in zip(longest, longest[1:]):
        assert before - after > call_positions, "a group that should have joined"


@pytest.mark.task(3)
def test_group_rows_keeps_similar_rows_together():
    assert tiny.group_rows([6001, 201, 201, 201], 256) == [[0], [1, 2, 3]]
    assert tiny.group_rows([30, 900, 40, 880], 256) == [[1, 3], [0, 2]]
    assert tiny.group_rows([5, 5, 5], 0) == [[0, 1, 2]]
    assert tiny.group_rows([7, 6], 0) == [[0], [1]]


# --- attend_staged on the decode rows ---------------------------------------------


def fill_rows(layer, rng, lengths, H, D, free):
    """One PagedKvCache per length (None for 0: an empty slot), its keys and values
    written through a table of shuffled blocks with room for a few more tokens."""
    views, history = [], []
    for length in lengths:
        if not length:
            views.append(None)
            history.append(None)
            continue
        blocks = [free.pop() for _ in range(tiny.blocks_needed(length + 4, 4))]
        view = tiny.PagedKvCache(layer, tiny.BlockTable(blocks))
        keys = rng.standard_normal((1, H, length, D)).astype(np.float32)
        values = rng.standard_normal((1, H, length, D)).astype(np.float32)
        view.update_and_fetch(mx.array(keys), mx.array(values))
        views.append(view)
        history.append((keys, values))
    return views, history


@pytest.mark.task(3)
@pytest.mark.parametrize("lengths", [[300, 5, 0, 290], [300, 290, 5, 0]])
@pytest.mark.parametrize("L", [1, 3])
def test_decode_rows_attend_by_length(L, lengths):
    """Rows of 300, 5, an empty slot and 290 positions (a group's rows apart, or
    each group a run of rows): attend_staged equals mx.fast's attention over each
    row's own keys alone (the chunk mask for L > 1), and attention is asked once per
    group, its keys gathered only as far as that group's longest row."""
    H, H_q, D = 2, 4, 8
    rng = np.random.default_rng(L)
    layer = tiny.LayerBlocks(200, 4)
    free = [int(b) for b in rng.permutation(200)]
    views, history = fill_rows(layer, rng, lengths, H, D, free)
    batch = tiny.PagedBatchingKvCache(4, 400)
    for slot, view in enumerate(views):
        if view is not None:
            batch.add_request(view, slot)
    q = rng.standard_normal((4, H_q, L, D)).astype(np.float32)
    new_k = rng.standard_normal((4, H, L, D)).astype(np.float32)
    new_v = rng.standard_normal((4, H, L, D)).astype(np.float32)
    calls = []

    def attention(q, keys, values, mask):
        calls.append((q.shape[0], keys.shape[2]))
        return mx.fast.scaled_dot_product_attention(
            q, keys, values, scale=D**-0.5, mask=mask
        )

    batch.stage(mx.array(new_k), mx.array(new_v))
    out = batch.attend_staged(mx.array(q), attention)
    assert out.shape == (4, H_q, L, D)
    assert sorted(calls) == [(2, 5 + L), (2, 300 + L)], (
        "the rows of 300 and 290 share a call gathered to 300 + L positions; the "
        "short row and the empty slot share one of 5 + L"
    )
    for slot, kept in enumerate(history):
        if kept is None:
            continue
        keys = np.concatenate([kept[0][0], new_k[slot]], axis=1)[None]
        values = np.concatenate([kept[1][0], new_v[slot]], axis=1)[None]
        alone = mx.fast.scaled_dot_product_attention(
            mx.array(q[slot : slot + 1]),
            mx.array(keys),
            mx.array(values),
            scale=D**-0.5,
            mask="causal" if L > 1 else None,
        )
        np.testing.assert_allclose(np.array(out[slot]), np.array(alone[0]), atol=1e-5)
    assert np.isfinite(np.array(out)).all(), "the empty row made NaN"


@pytest.mark.task(4)
@pytest.mark.parametrize("policy", ["alternate", "mixed"])
def test_engine_with_every_row_in_its_own_group(
    monkeypatch, random_pairs, tokenizer, policy
):
    """With CALL_POSITIONS 0 rows of different lengths never share a call: the
    tokens are still mlx-lm's greedy tokens for each prompt alone."""
    monkeypatch.setattr(tiny.paged_cache, "CALL_POSITIONS", 0)
    mlx_model, model = random_pairs[1]
    rng = np.random.default_rng(11)
    prompts = [token_ids(rng, mlx_model.args.vocab_size, n) for n in (3, 29, 12, 7)]
    engine = paged_engine(
        model,
        tokenizer,
        batch_size=3,
        max_seq_len=48,
        prefill_step=8,
        policy=policy,
        max_tokens=8,
        block_size=4,
    )
    results = run_engine(engine, prompts)
    assert_like_mlx_lm(results, mlx_model, prompts, 8, tokenizer)
    assert_pool_empty(engine)


# --- quantized keys and values ----------------------------------------------------


@pytest.mark.task(5)
@pytest.mark.parametrize("kv_dtype, bits", [("int8", 8), ("int4", 4)])
def test_quantized_rows_decode_within_one_step(kv_dtype, bits):
    """encode packs each row [.., D] into D * bits / 32 words and a float32 scale and
    bias per group of KV_GROUP_SIZE numbers; decode gives every number back within
    one quantization step of its group ((max - min) / (2^bits - 1), computed here
    from the rows), in the rows' dtype."""
    D = 64
    layer = tiny.QuantizedLayerBlocks(8, 4, kv_dtype)
    rng = np.random.default_rng(bits)
    rows = (rng.standard_normal((5, 3, D)) * rng.uniform(0.1, 8, (5, 3, 1))).astype(
        np.float32
    )
    stored = layer.encode(mx.array(rows))
    groups = D // KV_GROUP_SIZE
    assert stored.dtype == mx.uint32
    assert stored.shape == (5, 3, D * bits // 32 + 2 * groups)
    back = np.array(layer.decode(stored))
    assert back.dtype == np.float32 and back.shape == rows.shape
    grouped = rows.reshape(5, 3, groups, KV_GROUP_SIZE)
    step = (grouped.max(-1) - grouped.min(-1)) / (2**bits - 1)
    error = np.abs(back - rows).reshape(5, 3, groups, KV_GROUP_SIZE).max(-1)
    assert (error <= step * 1.0001 + 1e-6).all()


@pytest.mark.task(5)
@pytest.mark.parametrize("kv_dtype, bits", [("int8", 8), ("int4", 4)])
def test_quantized_rows_decode_as_mx_dequantize(kv_dtype, bits):
    """decode writes scale * q + bias out (the chapter's faster form); its numbers
    are mx.dequantize's of the same packed words, scales and biases, in any leading
    shape (a gather's [B, H, S, W])."""
    layer = tiny.QuantizedLayerBlocks(8, 4, kv_dtype)
    rows = mx.random.normal((2, 3, 7, 64), key=mx.random.key(bits)) * 3 + 1
    stored = layer.encode(rows)
    packed, scales, biases = mx.quantize(rows, group_size=KV_GROUP_SIZE, bits=bits)
    want = mx.dequantize(packed, scales, biases, group_size=KV_GROUP_SIZE, bits=bits)
    np.testing.assert_allclose(
        np.array(layer.decode(stored)), np.array(want), rtol=1e-6, atol=1e-6
    )


@pytest.mark.task(5)
def test_float16_rows_decode_as_a_cast():
    layer = tiny.QuantizedLayerBlocks(8, 4, "float16")
    rows = mx.random.normal((5, 3, 24)) * 10
    stored = layer.encode(rows)
    assert stored.dtype == mx.float16 and stored.shape == rows.shape
    back = layer.decode(stored)
    assert back.dtype == mx.float32
    np.testing.assert_array_equal(
        np.array(back), np.array(rows).astype(np.float16).astype(np.float32)
    )


@pytest.mark.task(5)
@pytest.mark.parametrize("paths", ["cpu", "gpu"])
def test_float16_decode_of_every_float16(monkeypatch, paths):
    """All 65,536 float16 bit patterns, in a float32 pool's layout: decode gives
    numpy's cast of each (infinities, NaNs and the sign of zero included). That is
    exact on the GPU's side of the device switch (a cast); on the CPU's side
    (float16_to_float32's bit trick) a subnormal, magnitude below 2^-14, comes back
    as a zero of its sign."""
    monkeypatch.setenv(PATHS_VARIABLE, paths)
    layer = tiny.QuantizedLayerBlocks(8, 4, "float16")
    layer.encode(mx.zeros((1, 1, 64)))  # the rows' dtype: float32
    bits = np.arange(2**16, dtype=np.uint16)
    numbers = bits.view(np.float16)
    want = numbers.astype(np.float32)
    if paths == "cpu":
        subnormal = (bits & 0x7FFF) != 0
        subnormal &= (bits & 0x7FFF) < 0x0400
        want[subnormal] = np.copysign(np.float32(0), want[subnormal])
    back = np.array(layer.decode(mx.array(numbers.reshape(4, 16, 16, 64))))
    assert back.dtype == np.float32
    back = back.reshape(-1)
    np.testing.assert_array_equal(back, want)
    np.testing.assert_array_equal(np.signbit(back), np.signbit(want))


@pytest.mark.task(5)
@pytest.mark.parametrize("kv_dtype, bits", [("int8", 8), ("int4", 4), ("float16", 11)])
def test_a_quantized_pool_reads_back_what_was_written(kv_dtype, bits):
    """Uneven chunks through a shuffled table of a quantized pool read back, with
    the chunk mask's rule, within one quantization step of what was written (for
    float16, 11 bits of precision)."""
    H, D, size = 2, 32, 3
    rng = np.random.default_rng(bits + 1)
    table = tiny.BlockTable([int(b) for b in rng.permutation(30)[:8]])
    layer = tiny.QuantizedLayerBlocks(30, size, kv_dtype)
    cache = tiny.PagedKvCache(layer, table)
    written = []
    for L in (4, 1, 7, 2):
        keys = rng.standard_normal((1, H, L, D)).astype(np.float32)
        written.append(keys)
        all_keys, all_values, mask = cache.update_and_fetch(
            mx.array(keys), mx.array(-keys)
        )
        expected = np.concatenate(written, axis=2)
        assert all_keys.shape == expected.shape and mask == (
            "causal" if L > 1 else None
        )
        tolerance = 2 * np.abs(expected).max() / (2**bits - 1)
        np.testing.assert_allclose(np.array(all_keys), expected, atol=tolerance)
        np.testing.assert_allclose(np.array(all_values), -expected, atol=tolerance)
    assert layer.keys.dtype == (mx.float16 if kv_dtype == "float16" else mx.uint32)


@pytest.mark.task(5)
@pytest.mark.parametrize("kv_dtype", ["float16", "int8", "int4"])
def test_quantized_engine_matches_mlx_lm_quantized_cache(
    embedded_model, embedded_week2_model, embedded_float32_reference, kv_dtype
):
    """The embedded model with kv_dtype float16 / int8 / int4 gives mlx-lm's greedy
    tokens with mlx-lm keeping its keys and values the same way (a KVCache in
    float16; its QuantizedKVCache of the same bits and group size): the same keys
    and values, read back by an independent implementation."""
    tokenizer = embedded_model[1]
    model = embedded_week2_model(True)
    texts = ["The capital of France is", "Red, green and", "One, two, three,"]
    prompts = [tokenizer.encode(text) for text in texts]
    engine = paged_engine(
        model,
        tokenizer,
        batch_size=2,
        max_seq_len=64,
        prefill_step=4,
        policy="mixed",
        max_tokens=8,
        kv_dtype=kv_dtype,
    )
    results = run_engine(engine, prompts)
    for i, (result, prompt) in enumerate(zip(results, prompts)):
        tokens, gaps = mlx_lm_greedy(
            embedded_float32_reference,
            prompt,
            8,
            tokenizer.eos_token_ids,
            kv_dtype=kv_dtype,
        )
        assert_same_tokens(result.tokens, tokens, gaps, f"prompt {i}")
    assert_pool_empty(engine)


@pytest.mark.task(5)
@pytest.mark.device_branch
def test_fast_kernels_on_a_float16_pool_match_mlx_lm_float16_cache(
    random_pairs, tokenizer
):
    """A random model with use_fast_kernels on a float16 pool, mixed steps: every
    device branch a step takes (fast_attention, swiglu, the pool's float16 decode)
    gives mlx-lm's greedy tokens with its keys and values in a float16 KVCache."""
    mlx_model, _ = random_pairs[1]
    model = tiny.Qwen2ModelWeek2(mlx_model, weights="float32", use_fast_kernels=True)
    rng = np.random.default_rng(12)
    prompts = [token_ids(rng, mlx_model.args.vocab_size, n) for n in (3, 29, 12)]
    engine = paged_engine(
        model,
        tokenizer,
        batch_size=2,
        max_seq_len=48,
        prefill_step=8,
        policy="mixed",
        max_tokens=8,
        block_size=4,
        kv_dtype="float16",
    )
    results = run_engine(engine, prompts)
    for i, (result, prompt) in enumerate(zip(results, prompts)):
        tokens, gaps = mlx_lm_greedy(
            mlx_model, prompt, 8, tokenizer.eos_token_ids, kv_dtype="float16"
        )
        assert_same_tokens(result.tokens, tokens, gaps, f"prompt {i}")
    assert_pool_empty(engine)


@pytest.mark.task(5)
def test_a_quantized_budget_holds_more_tokens(tokenizer, embedded_week2_model):
    """A kv_memory holds budget / (bytes a token x block size) blocks: for the
    embedded model (30 layers, 3 KV heads of 64) a token takes 46,080 bytes in
    float32, 23,040 in float16, 30 x 2 x 3 x (64 + 2 x 2 x 4) = 14,400 in int8 and
    30 x 2 x 3 x (32 + 16) in int4, and the pool's arrays take that many bytes a
    position."""
    model = embedded_week2_model(True)
    budget = 64 * 46_080 * 16
    per_token = {"float32": 46_080, "float16": 23_040, "int8": 14_400}
    per_token["int4"] = 30 * 2 * 3 * (32 + 16)
    for kv_dtype, size in per_token.items():
        engine = paged_engine(
            model, tokenizer, max_seq_len=64, kv_memory=budget, kv_dtype=kv_dtype
        )
        assert engine.metrics.kv_blocks_total == budget // (size * 16)
        # One token: the pool's arrays exist once a forward has written to them.
        run_engine(engine, [tiny.PromptSpec(tokenizer.encode("Hello"), max_tokens=1)])
        assert engine.metrics.kv_bytes_per_token == size


@pytest.mark.task(5)
@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(kv_dtype="int3"), "kv_dtype must be one of"),
        (dict(kv_cache="dense", kv_dtype="int8"), "kv_cache='paged'"),
    ],
)
def test_bad_kv_dtype_is_refused(pair, tokenizer, settings, message):
    with pytest.raises(ValueError, match=message):
        tiny.Engine(pair[1], tokenizer, **settings)


@pytest.mark.task(5)
def test_a_head_dim_the_groups_do_not_divide_is_refused(pair, tokenizer):
    """The first random model's heads have 16 numbers: groups of 32 do not fit."""
    with pytest.raises(ValueError, match="groups of 32 numbers, but this model's"):
        paged_engine(pair[1], tokenizer, kv_dtype="int8")
