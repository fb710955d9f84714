"""Week 3 day 2: the paged pool's keys and values in fewer bytes.

A float32 key row of one head, D numbers, takes 4 D bytes. EngineConfig.kv_dtype
picks a smaller form:
- "float16": each number cast to 16 bits: 2 D bytes, half.
- "int8" / "int4": quantized in groups of KV_GROUP_SIZE numbers, each group keeping
  its numbers as 8- or 4-bit integers and two float32s, a scale and a bias (x ~
  scale * q + bias: mx.quantize's affine form, the one quantized weights use since
  week 2 day 2). For the embedded model's D = 64 and groups of 32, a row takes 64 +
  16 = 80 bytes in int8, 32 + 16 = 48 in int4, against 256: 3.2x or 5.3x the
  tokens in the same memory.

Each row is stored on its own, so a block filled one decode token at a time never
has to be quantized again. A quantized row's three parts are kept side by side as
one uint32 row, `[H, W]`: W = D * bits / 32 packed words, then D / KV_GROUP_SIZE
scales and as many biases (their float32 bits). So LayerBlocks' staging, scatter and
gather work on the stored rows unchanged, and only the two ends change: stage
encodes what a step writes, gather decodes the blocks it reads back, in the keys'
own dtype, so attention sees ordinary keys.

A decode step reads back every position it attends to, so decode's cost is paid on
the whole context in every layer. MLX's CPU backend casts float16 to float32 one
number at a time (six to nine times a plain copy here: a float16 pool's step
took 1.2x float32's), so float16 is widened by float16_to_float32's integer ops
instead, which mx.compile fuses into one loop the C++ compiler vectorizes.
"""

import mlx.core as mx

from tiny_llm_base.device import gpu_paths
from tiny_llm_base.memory import KV_BITS, KV_GROUP_SIZE

from .cpu_kernels import ShapeLimitedCompile
from .layer_blocks import LayerBlocks

EXPONENT_BIAS_GAP = (127 - 15) << 23  # float32's exponent bias minus float16's
SMALLEST_NORMAL = 0x0400  # float16 bits without the sign: below it, subnormal
INFINITY = 0x7C00  # at or above it, infinity (or NaN when above)
QUIET_NAN = 0x400000  # float32's quiet-NaN bit, which a cast sets


def float16_bits_to_float32(bits: mx.array) -> mx.array:
    """float16 numbers' bits (uint16) -> the same numbers' float32 bits (uint32),
    as astype(mx.float32) gives them except that a subnormal (magnitude below
    2^-14, about 6.1e-5) becomes a zero of its sign.

    A normal float16 is sign, 5 exponent bits and 10 fraction bits; in float32 the
    fraction moves up 13 bits and the exponent gains 127 - 15. Infinities and NaNs
    keep float32's all-ones exponent. Comparisons are multiplied in as 0 or 1, not
    selected with mx.where, so that mx.compile makes one short loop.
    """
    u = bits.astype(mx.uint32)
    magnitude = u & 0x7FFF
    normal = (magnitude >= SMALLEST_NORMAL).astype(mx.uint32)
    special = (magnitude >= INFINITY).astype(mx.uint32)
    nan = (magnitude > INFINITY).astype(mx.uint32)
    out = normal * ((magnitude << 13) + EXPONENT_BIAS_GAP) + special * EXPONENT_BIAS_GAP
    return out | nan * QUIET_NAN | ((u & 0x8000) << 16)


# Compiled for each shape it meets (a decode step's gathered blocks change shape
# once every block_size steps); compiled shapelessly it ran four times slower.
widen_float16 = ShapeLimitedCompile(float16_bits_to_float32)


def float16_to_float32(stored: mx.array) -> mx.array:
    """float16 [...] -> float32 [...], float16_bits_to_float32's numbers (the
    mx.view at each end, which fuses with nothing, stays outside the compiled
    function)."""
    return mx.view(widen_float16(mx.view(stored, mx.uint16)), mx.float32)


class QuantizedLayerBlocks(LayerBlocks):
    """A LayerBlocks whose keys and values arrays hold rows encoded as kv_dtype says
    ("float16", "int8" or "int4"): [capacity, H, block_size, D] of float16, or
    [capacity, H, block_size, W] of uint32 (see the module's docstring).

    bits: 8 or 4 (None for float16). head_dim and dtype: the D and dtype of the rows
    encode was given last, which decode gives back.
    """

    def __init__(self, num_blocks: int, block_size: int, kv_dtype: str):
        super().__init__(num_blocks, block_size)
        self.bits = KV_BITS.get(kv_dtype)
        self.head_dim: int | None = None
        self.dtype: mx.Dtype | None = None

    def stage(
        self, blocks: list[int], slots: list[int], keys: mx.array, values: mx.array
    ) -> None:
        """As LayerBlocks.stage, the rows [n, H, D] encoded first."""
        super().stage(blocks, slots, self.encode(keys), self.encode(values))

    def encode(self, rows: mx.array) -> mx.array:
        """rows: [..., D] -> float16 [..., D]; or, quantized, [..., W] uint32: each
        row's packed integers, then its scales, then its biases (float32 bits,
        through mx.view). Keeps D and the rows' dtype for decode."""
        # Week 3 Day 2 Task 5: encode: keep head_dim and dtype; float16 (bits None): the
        # rows as float16; else mx.quantize the rows as float32 with group_size
        # KV_GROUP_SIZE and self.bits, and concatenate the packed words, mx.view(scales,
        # mx.uint32) and mx.view(biases, mx.uint32) along the last axis
        self.head_dim, self.dtype = rows.shape[-1], rows.dtype
        if self.bits is None:
            return rows.astype(mx.float16)
        packed, scales, biases = mx.quantize(
            rows.astype(mx.float32), group_size=KV_GROUP_SIZE, bits=self.bits
        )
        parts = [packed, mx.view(scales, mx.uint32), mx.view(biases, mx.uint32)]
        return mx.concatenate(parts, axis=-1)

    def decode(self, stored: mx.array) -> mx.array:
        """encode undone: [..., D] float16 or [..., W] uint32 -> [..., D] in the
        encoded rows' dtype (LayerBlocks.gather calls it on the gathered blocks).
        float16 to float32 on the CPU's side of the device switch (gpu_paths()) is
        float16_to_float32: subnormals come back as zeros; the GPU's side casts,
        exactly and fast.
        Quantized rows are x = scale * q + bias written out:
        the packed words read as bytes (two 4-bit numbers a byte, the low one first),
        each group times its scale plus its bias; on a CPU that is about twice as
        fast as mx.dequantize, to the same bits."""
        # Week 3 Day 2 Task 5: decode: float16: float16_to_float32 when self.dtype is
        # float32 and not gpu_paths() (the CPU's side), else a cast to self.dtype;
        # quantized: cut the last axis at words = head_dim * bits / 32 and words +
        # groups (groups = head_dim / KV_GROUP_SIZE), read scales and biases back
        # with mx.view(..., mx.float32); the words through mx.view(..., mx.uint8)
        # (4 bits: each byte's low and high four bits, in that order) as float32
        # numbers [..., groups, KV_GROUP_SIZE]; numbers * scales + biases, reshaped
        # to [..., head_dim], cast to self.dtype
        if self.bits is None:
            if self.dtype == mx.float32 and not gpu_paths():
                return float16_to_float32(stored)
            return stored.astype(self.dtype)
        words = self.head_dim * self.bits // 32
        groups = self.head_dim // KV_GROUP_SIZE
        scales = mx.view(stored[..., words : words + groups], mx.float32)
        biases = mx.view(stored[..., words + groups :], mx.float32)
        numbers = mx.view(stored[..., :words], mx.uint8)
        if self.bits == 4:
            numbers = mx.stack([numbers & 15, numbers >> 4], axis=-1)
        lead = stored.shape[:-1]
        numbers = numbers.astype(mx.float32).reshape(*lead, groups, KV_GROUP_SIZE)
        rows = numbers * scales[..., None] + biases[..., None]
        return rows.reshape(*lead, self.head_dim).astype(self.dtype)
