"""Week 2 Day 2: quantized matmul.

The answers come from MLX itself: numpy packing written here for the bit layout,
`mx.dequantize` for the weights, `mx.quantized_matmul` (run in float32) and the
embedded model's `nn.QuantizedLinear` / `nn.QuantizedEmbedding` layers for products.
"""

import mlx.core as mx
import numpy as np
import pytest
from mlx import nn

from tiny_llm_base.device import PATHS_VARIABLE, gpu_paths

from .helpers import as_float32, assert_within
from .solution import tiny

DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}
# Relative to the largest output: float32 rounding, then one rounding of the
# half-precision output plus the rounding of the dequantized weight.
TOLERANCE = {"float32": 1e-5, "float16": 4e-3, "bfloat16": 3e-2}


def assert_close(actual: mx.array, expected: mx.array, tol: float) -> None:
    """Within tol relative, and tol times the largest |expected| absolute."""
    scale = float(np.abs(as_float32(expected)).max())
    assert_within(actual, expected, tol * scale, rtol=tol)


def quantized(shape, dtype, group_size, bits):
    weight = mx.random.normal(shape).astype(dtype)
    return mx.quantize(weight, group_size=group_size, bits=bits)


def float32_quantized_matmul(
    a, packed, scales, biases, group_size, bits, transpose=True
):
    """MLX's own kernel, run in float32 so that its result is the exact answer."""
    return mx.quantized_matmul(
        a.astype(mx.float32),
        packed,
        scales.astype(mx.float32),
        biases.astype(mx.float32),
        transpose=transpose,
        group_size=group_size,
        bits=bits,
    )


@pytest.mark.task(1)
@pytest.mark.parametrize("bits", [2, 4, 8])
def test_unpack_reads_values_lowest_bits_first(bits):
    rng = np.random.default_rng(bits)
    per_word = 32 // bits
    values = rng.integers(0, 2**bits, size=(5, 3 * per_word), dtype=np.uint64)
    words = np.zeros((5, 3), dtype=np.uint64)
    for position in range(per_word):
        words |= values[:, position::per_word] << np.uint64(position * bits)
    unpacked = tiny.unpack_quantized(mx.array(words.astype(np.uint32)), bits)
    assert unpacked.shape == (5, 3 * per_word)
    np.testing.assert_array_equal(np.array(unpacked), values)


@pytest.mark.task(1)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("bits", [2, 4, 8])
def test_dequantize_weight_matches_mlx(bits, group_size, dtype):
    packed, scales, biases = quantized(
        (37, 3 * group_size), DTYPES[dtype], group_size, bits
    )
    expected = mx.dequantize(packed, scales, biases, group_size=group_size, bits=bits)
    actual = tiny.dequantize_weight(scales, biases, group_size, bits, packed)
    assert actual.dtype == expected.dtype
    assert_close(actual, expected, TOLERANCE[dtype] / 10)


@pytest.mark.task(2)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("bits", [4, 8])
def test_quantized_matmul_matches_mlx(bits, group_size, dtype):
    packed, scales, biases = quantized(
        (37, 3 * group_size), DTYPES[dtype], group_size, bits
    )
    a = mx.random.normal((5, 3 * group_size)).astype(DTYPES[dtype])
    actual = tiny.quantized_matmul(scales, biases, group_size, bits, a, packed)
    expected = float32_quantized_matmul(a, packed, scales, biases, group_size, bits)
    same_dtype = mx.quantized_matmul(
        a, packed, scales, biases, group_size=group_size, bits=bits
    )
    assert actual.dtype == same_dtype.dtype
    assert_close(actual, expected, TOLERANCE[dtype])


@pytest.mark.task(2)
@pytest.mark.parametrize(
    "a_shape, n",
    [((1, 96), 19), ((3, 4, 96), 40), ((2, 1, 7, 96), 1), ((13, 96), 130)],
    ids=["decode", "batched", "four-dims", "wide"],
)
def test_quantized_matmul_shapes(a_shape, n):
    packed, scales, biases = quantized((n, 96), mx.float32, 32, 4)
    a = mx.random.normal(a_shape)
    actual = tiny.quantized_matmul(scales, biases, 32, 4, a, packed)
    expected = float32_quantized_matmul(a, packed, scales, biases, 32, 4)
    assert actual.shape == (*a_shape[:-1], n)
    assert_close(actual, expected, TOLERANCE["float32"])


@pytest.mark.task(2)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("bits", [4, 8])
def test_quantized_matmul_untransposed(bits, dtype):
    # b holds a [K, N] weight, quantized along N: the result is a @ dequant(b).
    packed, scales, biases = quantized((48, 128), DTYPES[dtype], 64, bits)
    a = mx.random.normal((2, 3, 48)).astype(DTYPES[dtype])
    actual = tiny.quantized_matmul(
        scales, biases, 64, bits, a, packed, transpose_b=False
    )
    expected = float32_quantized_matmul(
        a, packed, scales, biases, 64, bits, transpose=False
    )
    assert_close(actual, expected, TOLERANCE[dtype])


@pytest.mark.task(1)
def test_unsupported_bits_and_mismatched_group_size_say_so():
    packed, scales, biases = quantized((8, 64), mx.float32, 32, 4)
    with pytest.raises(ValueError, match="bits"):
        tiny.dequantize_weight(scales, biases, 32, 3, packed)
    with pytest.raises(ValueError, match="group_size"):
        tiny.dequantize_weight(scales, biases, 64, 4, packed)


@pytest.mark.task(2)
def test_embedded_model_linear_layers(embedded_model):
    model, _ = embedded_model
    layer = model.model.layers[0]
    a = mx.random.normal((2, 3, 576))
    for linear in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.mlp.down_proj):
        assert isinstance(linear, nn.QuantizedLinear)
        weights = tiny.QuantizedWeights.from_mlx_layer(linear)
        assert (weights.bits, weights.group_size) == (4, 32)
        inputs = (
            a if linear is not layer.mlp.down_proj else mx.random.normal((2, 3, 1536))
        )
        actual = tiny.quantized_matmul(
            weights.scales,
            weights.biases,
            weights.group_size,
            weights.bits,
            inputs,
            weights.weight,
        )
        # float32 activations, float16 scales: the product must be float32 throughout.
        assert actual.dtype == mx.float32
        assert_close(actual, linear(inputs), 1e-5)


@pytest.mark.task(2)
def test_embedded_model_embedding_and_tied_head(embedded_model):
    model, _ = embedded_model
    embedding = model.model.embed_tokens
    assert isinstance(embedding, nn.QuantizedEmbedding)
    weights = tiny.QuantizedWeights.from_mlx_layer(embedding)
    assert (weights.bits, weights.group_size) == (8, 32)
    ids = mx.array([[0, 1, 17, 49151], [576, 2, 3, 4]])
    rows = tiny.dequantize_weight(
        weights.scales[ids], weights.biases[ids], 32, 8, weights.weight[ids]
    )
    assert rows.shape == (2, 4, 576)
    assert_close(rows, embedding(ids), TOLERANCE["float16"] / 10)
    hidden = mx.random.normal((1, 2, 576)).astype(mx.float16)
    logits = tiny.quantized_matmul(
        weights.scales,
        weights.biases,
        weights.group_size,
        weights.bits,
        hidden,
        weights.weight,
    )
    assert logits.shape == (1, 2, 49152)
    assert_close(
        logits, embedding.as_linear(hidden.astype(mx.float32)), TOLERANCE["float16"]
    )


@pytest.mark.task(1)
def test_from_mlx_layer_rejects_other_modes():
    with pytest.raises(ValueError, match="affine"):
        tiny.QuantizedWeights.from_mlx_layer(
            nn.QuantizedLinear(64, 32, bias=False, mode="mxfp4")
        )


@pytest.mark.task(2)
def test_choose_weight_format_per_device(monkeypatch):
    """A device named picks its format; none named, the device switch's side."""
    assert tiny.choose_weight_format(mx.Device(mx.cpu)) == "float32"
    assert tiny.choose_weight_format(mx.Device(mx.gpu)) == "quantized"
    default = "quantized" if gpu_paths() else "float32"
    assert tiny.choose_weight_format() == default
    for paths, expected in (("cpu", "float32"), ("gpu", "quantized")):
        monkeypatch.setenv(PATHS_VARIABLE, paths)
        assert tiny.choose_weight_format() == expected
        assert tiny.choose_weight_format(mx.Device(mx.cpu)) == "float32"
