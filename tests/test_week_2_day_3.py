"""Week 2 Day 3: fast paths.

use_fast_kernels=True runs mx.fast.rms_norm, mx.fast.rope,
mx.fast.scaled_dot_product_attention and mx.quantized_matmul instead of the
hand-written kernels. References: mlx-lm's own models on the whole sequence without
a cache (random qwen2/llama ones at unusual sizes, and the embedded SmolLM2), and
the same model with use_fast_kernels=False: the switch may change rounding, never
results. The device switch (tiny_llm_base.device.gpu_paths, forced here through
TINY_LLM_DEVICE_PATHS) picks each branch's side: the GPU's runs on this CPU too. No
timings here: `pdm run bench` measures speed.
"""

import functools

import mlx.core as mx
import pytest
from mlx import nn

from tiny_llm_base.device import PATHS_VARIABLE
from tiny_llm_base.mlx_lm_reference import mlx_lm_greedy

from .helpers import assert_same_tokens, assert_within
from .random_models import random_models
from .solution import tiny
from .test_week_2_day_1 import check_embedded_last_position, check_last_position_only

pytestmark = pytest.mark.task(3)

# Absolute, on logits of size ~0.5 (random models), as on day 1.
TOLERANCE = {mx.float32: 1e-4, mx.bfloat16: 2e-2}
# Embedded model against mlx-lm (its own 4-bit matmuls, logits up to ~40) as on
# day 1; fast against hand-written kernels on the same float32 weights is tighter.
EMBEDDED_LOGIT_ATOL = 0.3
FAST_VS_SLOW_ATOL = 5e-3
PREFILL_THEN_DECODE = [5, 1, 1, 1, 1, 1, 1]
CHUNKS = [4, 3, 1, 3]


def feed(model, inputs: mx.array, lengths: list[int], shift=0) -> mx.array:
    """Run inputs [B, T] through a fresh cache in pieces of `lengths` tokens; return
    the logits of all T positions. Each piece's offset is shift + its start, where
    shift is an int or an mx.array with one shift per row."""
    cache = model.create_kv_cache()
    logits, start = [], 0
    for length in lengths:
        logits.append(model(inputs[:, start : start + length], shift + start, cache))
        start += length
    return mx.concatenate(logits, axis=1)


# Same shape and dtype, and |actual - expected| <= atol.
assert_close = functools.partial(assert_within, same_dtype=True)


@pytest.mark.device_branch
@pytest.mark.parametrize(
    "dtype", [mx.float32, mx.bfloat16], ids=["float32", "bfloat16"]
)
@pytest.mark.parametrize(
    "lengths", [PREFILL_THEN_DECODE, CHUNKS], ids=["prefill-decode", "chunks"]
)
def test_fast_kernels_match_mlx_lm_and_the_hand_written_ones(dtype, lengths):
    for reference in random_models(dtype):
        fast = tiny.Qwen2ModelWeek2(reference, weights="float32", use_fast_kernels=True)
        slow = tiny.Qwen2ModelWeek2(reference, weights="float32")
        inputs = mx.random.randint(0, reference.args.vocab_size, (2, 11))
        actual = feed(fast, inputs, lengths)
        assert_close(actual, reference(inputs), TOLERANCE[dtype])
        assert_close(actual, feed(slow, inputs, lengths), TOLERANCE[dtype])


@pytest.mark.device_branch
def test_fast_kernels_on_long_chunks():
    """Prompt chunks of hundreds of tokens, the second one after cached keys (the
    reference splits long causal chunks into query blocks on a CPU)."""
    for reference in random_models()[::3]:
        fast = tiny.Qwen2ModelWeek2(reference, weights="float32", use_fast_kernels=True)
        slow = tiny.Qwen2ModelWeek2(reference, weights="float32")
        inputs = mx.random.randint(0, reference.args.vocab_size, (1, 400))
        actual = feed(fast, inputs, [260, 139, 1])
        assert_close(actual, reference(inputs), TOLERANCE[mx.float32])
        assert_close(actual, feed(slow, inputs, [260, 139, 1]), TOLERANCE[mx.float32])


def test_fast_kernels_take_one_offset_per_row():
    """Rows of a batch sit at different positions (day 5): apply_rope with one offset
    per row rotates each row as mlx.nn.RoPE rotates it alone at its offset, with
    mx.fast.rope and with the hand-written RoPE alike."""
    offsets = [0, 37, 250]
    for reference in random_models()[:2]:
        args = reference.args
        for use_fast_kernels in (False, True):
            model = tiny.Qwen2ModelWeek2(
                reference, weights="float32", use_fast_kernels=use_fast_kernels
            )
            attention = model.layers[0].attention
            head_dim = args.hidden_size // args.num_attention_heads
            x = mx.random.normal((len(offsets), args.num_attention_heads, 5, head_dim))
            rope = nn.RoPE(head_dim, args.rope_traditional, base=args.rope_theta)
            expected = mx.concatenate(
                [rope(x[row : row + 1], offset) for row, offset in enumerate(offsets)]
            )
            actual = attention.apply_rope(x, mx.array(offsets))
            assert_close(actual, expected, TOLERANCE[mx.float32])


@pytest.fixture(scope="module")
def embedded_inputs(embedded_model):
    """(mlx-lm model, token ids [1, T], mlx-lm's logits for them without a cache)."""
    mlx_model, tokenizer = embedded_model
    ids = tokenizer.encode(
        "The capital of France is Paris, and the capital of Italy is"
    )
    inputs = mx.array(ids)[None]
    return mlx_model, inputs, mlx_model(inputs)


@pytest.mark.parametrize("weights", ["float32", "quantized"])
def test_embedded_model_fast_kernels_match_mlx_lm(
    embedded_inputs, embedded_week2_model, weights
):
    """weights="quantized" multiplies by the packed 4-bit weights: with
    quantized_matmul by hand, mx.quantized_matmul on the fast path."""
    mlx_model, inputs, expected = embedded_inputs
    lengths = [inputs.shape[1] - 3, 1, 1, 1]
    results = {}
    for use_fast_kernels in (False, True):
        model = embedded_week2_model(use_fast_kernels, weights)
        results[use_fast_kernels] = feed(model, inputs, lengths)
        assert_close(results[use_fast_kernels], expected, EMBEDDED_LOGIT_ATOL)
    assert_close(results[True], results[False], FAST_VS_SLOW_ATOL)


@pytest.mark.parametrize("paths", ["cpu", "gpu"])
def test_the_device_switch_picks_the_attention_kernel(monkeypatch, paths):
    """The GPU's side runs mx.fast.scaled_dot_product_attention, once a layer per
    call; the CPU's side cpu_attention, never mx.fast's. Both give mlx-lm's logits."""
    monkeypatch.setenv(PATHS_VARIABLE, paths)
    reference = random_models()[0]
    inputs = mx.random.randint(0, reference.args.vocab_size, (2, 11))
    expected = reference(inputs)  # before the spy: mlx-lm calls mx.fast's kernel too
    fused = mx.fast.scaled_dot_product_attention
    calls = []

    def spy(*args, **kwargs):
        calls.append(args[0].shape)
        return fused(*args, **kwargs)

    monkeypatch.setattr(mx.fast, "scaled_dot_product_attention", spy)
    model = tiny.Qwen2ModelWeek2(reference, weights="float32", use_fast_kernels=True)
    assert_close(feed(model, inputs, CHUNKS), expected, TOLERANCE[mx.float32])
    layers = reference.args.num_hidden_layers
    assert len(calls) == (layers * len(CHUNKS) if paths == "gpu" else 0), calls


def greedy_tokens(model, prompt: list[int], count: int) -> list[int]:
    """`count` greedy tokens after `prompt`: the prompt at offset 0, then each
    chosen token alone at the next offset."""
    cache = model.create_kv_cache()
    logits = model(mx.array(prompt)[None], 0, cache)
    tokens = []
    for offset in range(len(prompt), len(prompt) + count):
        tokens.append(mx.argmax(logits[0, -1]).item())
        logits = model(mx.array([[tokens[-1]]]), offset, cache)
    return tokens


def test_auto_weights_on_the_gpu_side_give_float32_greedy_tokens(
    monkeypatch, embedded_model, embedded_week2_model, embedded_float32_reference
):
    """weights="auto" on the GPU's side keeps the embedded model's 4-bit weights
    (mx.quantized_matmul on the fast path): its greedy tokens are those of mlx-lm's
    model with the same weights dequantized to float32."""
    monkeypatch.setenv(PATHS_VARIABLE, "gpu")
    model = embedded_week2_model(True, "auto")
    assert isinstance(model.layers[0].w_gate, tiny.QuantizedWeights)
    prompt = embedded_model[1].encode("The capital of France is")
    expected, gaps = mlx_lm_greedy(embedded_float32_reference, prompt, 8, ())
    assert_same_tokens(greedy_tokens(model, prompt, 8), expected, gaps, "auto")


@pytest.mark.parametrize("lengths", [[11], [4, 7]], ids=["whole", "chunks"])
def test_fast_kernels_give_only_the_last_position(lengths):
    """Week 2 Day 1's last_position_only check, on the fast kernels."""
    check_last_position_only(lengths, fast=True)


def test_embedded_model_fast_kernels_give_only_the_last_position(
    embedded_model, embedded_week2_model, embedded_float32_reference
):
    check_embedded_last_position(
        embedded_model[1], embedded_week2_model(True), embedded_float32_reference
    )


@pytest.mark.parametrize("traditional", [False, True])
def test_fused_rope_is_mx_fast_rope_at_any_offset(traditional):
    """One fused_rope per setting serves every position: a scalar offset at several
    positions and one offset per row, each equal to mx.fast.rope's own."""
    rope = tiny.fused_rope(32, traditional, 10000.0)
    x = mx.random.normal((3, 4, 2, 32))
    for offset in (0, 7, 300):
        expected = mx.fast.rope(
            x, 32, traditional=traditional, base=10000.0, scale=1.0, offset=offset
        )
        assert_close(rope(x, mx.array(offset)), expected, 1e-6)
    rows = mx.array([0, 5, 41])
    expected = mx.fast.rope(
        x, 32, traditional=traditional, base=10000.0, scale=1.0, offset=rows
    )
    assert_close(rope(x, rows), expected, 1e-6)


@pytest.mark.parametrize("paths", ["cpu", "gpu"])
@pytest.mark.parametrize("traditional", [False, True])
def test_fast_rope_is_mx_fast_rope_as_offsets_come_and_go(
    monkeypatch, paths, traditional
):
    """FastRope on both sides of the device switch, against mx.fast.rope: int
    offsets, one offset per row, an offset seen again (the rows it keeps), a new
    array with other values, a new length at the same offset, bfloat16."""
    monkeypatch.setenv(PATHS_VARIABLE, paths)
    rope = tiny.FastRope(tiny.RoPE(32, 1000, 10000.0, traditional), 10000.0)
    x = mx.random.normal((3, 4, 2, 32))

    def expected(x, offset):
        return mx.fast.rope(
            x, 32, traditional=traditional, base=10000.0, scale=1.0, offset=offset
        )

    # Angles up to ~1,000 radians: float32 spaces them 6e-5 apart, and the table and
    # mx.fast.rope round them on their own.
    atol = 1e-4
    for offset in (0, 7, 7, 300, 0, 998):
        assert_close(rope(x, offset), expected(x, offset), atol)
    rows = mx.array([0, 5, 41])
    for x_now in (x, x, x[:, :, :1], x):
        assert_close(rope(x_now, rows), expected(x_now, rows), atol)
    other = mx.array([9, 0, 700])
    assert_close(rope(x, other), expected(x, other), atol)
    half = x.astype(mx.bfloat16)
    assert_close(rope(half, 12), expected(half, 12), 2e-2)


@pytest.mark.parametrize("paths", ["cpu", "gpu"])
@pytest.mark.parametrize("traditional", [False, True])
def test_fast_rope_refuses_positions_past_its_table(monkeypatch, paths, traditional):
    monkeypatch.setenv(PATHS_VARIABLE, paths)
    rope = tiny.FastRope(tiny.RoPE(16, 100, 10000.0, traditional), 10000.0)
    with pytest.raises(ValueError, match="seq_len"):
        rope(mx.zeros((1, 2, 3, 16)), 98)


def test_packed_rows_stack_dense_projections_and_refuse_the_rest():
    """packed_rows against numpy: dense [out_i, in] weights stacked along their rows,
    their biases likewise (or None with none); None for a quantized weight, or for
    biases on some projections only (the one product could not add them)."""
    import numpy as np

    rng = np.random.default_rng(3)
    weights = [rng.standard_normal((n, 6)).astype(np.float32) for n in (4, 2, 2)]
    biases = [rng.standard_normal(n).astype(np.float32) for n in (4, 2, 2)]
    dense = [mx.array(w) for w in weights]
    packed, bias = tiny.packed_rows(dense, [mx.array(b) for b in biases])
    assert np.array_equal(np.array(packed), np.concatenate(weights))
    assert np.array_equal(np.array(bias), np.concatenate(biases))
    packed, bias = tiny.packed_rows(dense, [None] * 3)
    assert np.array_equal(np.array(packed), np.concatenate(weights)) and bias is None
    assert tiny.packed_rows(dense, [mx.array(biases[0]), None, None]) is None
    layer = nn.QuantizedLinear(64, 32, bias=False, group_size=32, bits=4)
    quantized = tiny.QuantizedWeights.from_mlx_layer(layer)
    assert tiny.packed_rows([quantized, mx.zeros((32, 64))], [None, None]) is None


@pytest.mark.parametrize(
    "dtype", [mx.float32, mx.bfloat16], ids=["float32", "bfloat16"]
)
def test_fused_rms_norm_is_mx_fast_rms_norm(dtype):
    x = mx.random.normal((2, 5, 48)).astype(dtype)
    weight = mx.random.normal((48,)).astype(dtype)
    for eps in (1e-6, 1e-2):
        expected = mx.fast.rms_norm(x, weight, eps)
        assert_close(tiny.fused_rms_norm(x, weight, eps), expected, 1e-6)
