"""Quantized matmul: multiply by a weight stored as 2-, 4- or 8-bit integers.

MLX's affine quantization cuts each row of a weight into groups of `group_size`
consecutive values. Each group keeps one `scale` and one `bias`, and each value
becomes a small unsigned integer `q` with

    value = scale * q + bias

The integers are packed into uint32 words, the first value of a word in its lowest
bits. A 4-bit [N, K] weight is therefore a uint32 [N, K / 8] array plus scales and
biases of shape [N, K / group_size]: 4.5 to 5 bits per value (float16 scales and
biases, group size 64 or 32) instead of 16 or 32.
"""

import mlx.core as mx

SUPPORTED_BITS = (2, 4, 8)


def _check_bits(bits: int) -> None:
    if bits not in SUPPORTED_BITS:
        raise ValueError(
            f"bits={bits} is not supported: use one of {SUPPORTED_BITS} "
            "(these widths divide 32, so no value straddles two uint32 words)"
        )


def unpack_quantized(packed: mx.array, bits: int) -> mx.array:
    """Split each uint32 word into its `32 / bits` integers, lowest bits first.

    packed: [..., K * bits / 32] uint32 -> [..., K] uint32, each value < 2**bits.
    bits must divide 32 (2, 4 or 8); raise ValueError otherwise.
    """
    # Week 2 Day 2 Task 1: unpack_quantized: shift each word right by 0, bits, 2*bits,
    # ... and mask with 2**bits - 1
    _check_bits(bits)
    per_word = 32 // bits
    shifts = mx.arange(per_word, dtype=mx.uint32) * bits
    mask = (1 << bits) - 1
    values = (packed[..., None] >> shifts) & mask  # [..., K * bits / 32, per_word]
    return values.reshape(*packed.shape[:-1], packed.shape[-1] * per_word)


def dequantize_weight(
    scales: mx.array, biases: mx.array, group_size: int, bits: int, b: mx.array
) -> mx.array:
    """Rebuild the float weight: `scale * q + bias`, one scale and bias per group.

    b: [..., N, K * bits / 32] uint32; scales, biases: [..., N, K / group_size]
    -> [..., N, K] in the dtype of `scales`. Leading dims let an embedding look up
    rows first (`b[ids]`, `scales[ids]`, ...) and rebuild only those. Scales that do
    not fit b's shape and group_size raise ValueError.
    """
    # Week 2 Day 2 Task 1: dequantize_weight: unpack, reshape to [N, K / group_size,
    # group_size], apply scale and bias per group
    q = unpack_quantized(b, bits)
    *rows, cols = q.shape
    groups = cols // group_size
    if cols % group_size != 0 or scales.shape != (*rows, groups):
        raise ValueError(
            f"scales of shape {scales.shape} do not fit a {bits}-bit weight of shape "
            f"{(*rows, cols)} with group_size={group_size}: expected "
            f"{(*rows, groups)}; pass the group_size and bits the weight was "
            "quantized with"
        )
    grouped = q.reshape(*rows, groups, group_size).astype(scales.dtype)
    values = grouped * scales[..., None] + biases[..., None]
    return values.reshape(*rows, cols)


def quantized_matmul(
    scales: mx.array,
    biases: mx.array,
    group_size: int,
    bits: int,
    a: mx.array,
    b: mx.array,
    transpose_b: bool = True,
) -> mx.array:
    """`a @ dequant(b).T` (or `a @ dequant(b)` with transpose_b=False).

    a: [..., K]; b: [N, K * bits / 32] uint32 with scales, biases: [N, K / group_size]
    -> [..., N]. With transpose_b=False, b holds a [K, N] weight quantized along N
    and the result is again [..., N].
    The weight is rebuilt in the result dtype (a's and scales' promoted, as
    mx.quantized_matmul returns): float32 inputs with float16 scales must not round
    the rebuilt weight to float16.
    """
    # Week 2 Day 2 Task 2: quantized_matmul: dequantize b in the result dtype, then
    # matmul
    dtype = mx.result_type(a, scales)
    weight = dequantize_weight(
        scales.astype(dtype), biases.astype(dtype), group_size, bits, b
    )
    return a @ (weight.T if transpose_b else weight)
