"""The week 2 model's operations, each with a hand-written path and a fast one.

project (a dense or a quantized weight), rms_norm, swiglu and fast_attention are what
a Qwen2 block calls (qwen2_week2.py); `fast` picks mx.fast's fused kernels or, on a
CPU, this course's own (cpu_kernels.py). WeightLoader turns mlx-lm's layers into the
weights they use, and check_offset guards the one number a cached step must get
right: the position of its first new token.
"""

import functools
from collections.abc import Callable

import mlx.core as mx
from mlx import nn

from tiny_llm_base import QuantizedWeights, dequantize_linear
from tiny_llm_base.device import gpu_paths

from .basics import linear, silu
from .cpu_kernels import ShapeLimitedCompile, cpu_attention, fast_exp
from .kv_cache import TinyKvCache
from .layer_norm import RMSNorm
from .positional_encoding import RoPE
from .quantize import quantized_matmul

Weight = mx.array | QuantizedWeights


def project(
    x: mx.array, w: Weight, bias: mx.array | None = None, fast: bool = False
) -> mx.array:
    """x: [..., in] -> [..., out] through a dense [out, in] or a quantized weight."""
    raise NotImplementedError(
        "Week 2 Day 1 Task 2: project: linear(x, w, bias) for a dense weight. Day 2: "
        "a QuantizedWeights w goes through quantized_matmul(w.scales, w.biases, "
        "w.group_size, w.bits, x, w.weight). Day 3: with fast, mx.quantized_matmul"
    )


def packed_rows(
    weights: list[Weight], biases: list[mx.array | None]
) -> tuple[mx.array, mx.array | None] | None:
    """Projections of the same input stacked: dense weights [out_i, in] into one
    [sum out_i, in] (and their biases into one), so that one product does the work
    of len(weights). None when a weight is quantized or only some have a bias."""
    raise NotImplementedError(
        "Week 2 Day 3 Task 3: packed_rows: None unless every weight is a dense "
        "mx.array and the biases are all None or all there; else the weights "
        "concatenated along axis 0, and the biases (or None)"
    )


# ANCHOR: swiglu
@mx.compile
def swiglu_fast_exp(gate: mx.array, up: mx.array) -> mx.array:
    """silu(gate) * up, [..., hidden]: compiled, with the sigmoid's exp from fast_exp.

    silu(x) = x * sigmoid(x) = x / (1 + exp(-x)); exp(-x) = inf for x below -88
    gives -0, the limit. The result keeps gate's dtype.
    """
    raise NotImplementedError(
        "Week 2 Day 3 Task 3: swiglu_fast_exp: silu(gate) * up as gate / (1 + "
        "fast_exp(-gate)) (back in gate's dtype) times up, decorated with @mx.compile"
        " so the elementwise ops run as fused loops"
    )


def swiglu(gate: mx.array, up: mx.array) -> mx.array:
    """silu(gate) * up, [..., hidden]: swiglu_fast_exp on the CPU, silu(gate) * up
    elsewhere. fast_exp rounds by adding and subtracting 1.5 * 2^23, which only
    strict float arithmetic keeps; a GPU's fast-math compiler may fold it away, and
    a GPU's own exp is fast anyway."""
    raise NotImplementedError(
        "Week 2 Day 3 Task 3: swiglu: silu(gate) * up where gpu_paths() (the device "
        "switch, tiny_llm_base.device), else swiglu_fast_exp"
    )
    # ANCHOR_END: swiglu


# ANCHOR: fast_attention
def fast_attention(
    q: mx.array, k: mx.array, v: mx.array, scale: float, mask: mx.array | str | None
) -> mx.array:
    """mx.fast.scaled_dot_product_attention, or on a CPU cpu_attention.

    q: [B, H_q, L, D], k and v: [B, H, S, D] -> [B, H_q, L, D]. On a GPU the fast
    kernel is one fused pass. On MLX's CPU backend it is attention composed of
    ordinary ops, its softmax exps at about 15 ns each; cpu_attention was measured
    faster there for every shape the model runs, a chunk over a long context
    several times, a decode step with a batch about twice.
    """
    raise NotImplementedError(
        "Week 2 Day 3 Task 3: fast_attention: mx.fast.scaled_dot_product_attention(q,"
        " k, v, scale=scale, mask=mask) passes the tests; then, unless gpu_paths(), "
        "cpu_attention(q, k, v, scale, mask)"
    )
    # ANCHOR_END: fast_attention


def rms_norm(norm: RMSNorm, x: mx.array, fast: bool = False) -> mx.array:
    """x: [..., dim] normalized by `norm`, by hand or by mx.fast.rms_norm.

    RMSNorm keeps its weight in float32; mx.fast.rms_norm gets it in x's dtype so
    that, like the hand-written norm, it returns x's dtype (a float32 weight would
    promote a bfloat16 model's activations to float32).
    """
    raise NotImplementedError(
        "Week 2 Day 1 Task 2: rms_norm: norm(x). Day 3: with fast, fused_rms_norm(x, "
        "norm.weight.astype(x.dtype), norm.eps)"
    )


@mx.compile
def fused_rms_norm(x: mx.array, weight: mx.array, eps: float) -> mx.array:
    """mx.fast.rms_norm under mx.compile, x: [..., dim]. On a GPU mx.fast.rms_norm is
    one kernel; on a CPU it is the graph of its parts (square, mean, rsqrt, two
    multiplies, casts), each op paying MLX's fixed cost, and compiled those fuse."""
    raise NotImplementedError(
        "Week 2 Day 3 Task 3: fused_rms_norm: mx.fast.rms_norm(x, weight, eps), "
        "decorated with @mx.compile (eps, a Python float, is a constant of the "
        "compiled graph)"
    )


@functools.cache
def fused_rope(
    dims: int, traditional: bool, base: float
) -> Callable[[mx.array, mx.array], mx.array]:
    """rope(x, offset) -> mx.fast.rope(x, dims, ...) under mx.compile; x: [B, H, L,
    D], offset an mx.array (a scalar, or [B] for rows at their own positions). An int
    offset would be a constant of the compiled graph, traced again at every new
    position. One function per setting, shared by every layer. On a CPU
    mx.fast.rope is ~17 small ops (the frequencies, their cos and sin, the halves'
    products), the largest share of a decode step's ops; compiled, a few."""
    raise NotImplementedError(
        "Week 2 Day 3 Task 3: fused_rope: mx.compile of a function of (x, offset) "
        "that returns mx.fast.rope(x, dims, traditional=traditional, base=base, "
        "scale=1.0, offset=offset); functools.cache makes it one per setting"
    )


# ANCHOR: fast_rope
def same_offset(a: int | mx.array, b: int | mx.array) -> bool:
    """Two ints that are equal, or one mx.array object (never read: no sync)."""
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    return a is b


def rotate_halves(x: mx.array, cos: mx.array, sin: mx.array) -> mx.array:
    """x: [B, H, L, D], its halves (a, b) rotated to (a cos - b sin, a sin + b cos);
    cos and sin: [1 or B, 1, L, D / 2]. Computed in cos's dtype, returned in x's."""
    raise NotImplementedError(
        "Week 2 Day 3 Task 3: rotate_halves: split x's last axis in halves, rotate "
        "them, concatenate, back in x's dtype"
    )


# Compiled: the products and sums of both halves run as one fused loop. A prefill
# chunk's length is a new shape, so the traces are begun afresh now and then.
rotate_halves_compiled = ShapeLimitedCompile(rotate_halves)


class FastRope:
    """RoPE on the fast path, x: [B, H, L, D], one object shared by a model's layers.

    On a GPU, and for a traditional RoPE (neighbours paired, not halves),
    fused_rope. On a CPU mx.fast.rope is a dozen small operations each call (the
    frequencies, cos, sin, the halves), and a decode step calls it twice a layer.
    Instead the rows of `rope`'s own cos/sin table at the step's positions are
    gathered once: every layer of a step rotates at the same offset (the same int, or
    the same mx.array object, which must not be changed in place afterwards), so the
    last rows are kept until the offset or the length changes. They are kept in
    `_last`: a leading underscore tells the disk tier's model identity (week 3 day
    3) that this is what a step left behind, not what the model is. offset: an int
    or an mx.array [1 or B] of start positions, within the table's seq_len.
    """

    def __init__(self, rope: RoPE, base: float):
        raise NotImplementedError(
            "Week 2 Day 3 Task 3: FastRope.__init__: keep rope and base; no rows kept"
            " yet (self._last = None: the leading underscore keeps them out of the "
            "model's identity)"
        )

    def __call__(self, x: mx.array, offset: int | mx.array) -> mx.array:
        raise NotImplementedError(
            "Week 2 Day 3 Task 3: FastRope: on every path, an int offset past the "
            "table is a ValueError naming seq_len; fused_rope(rope.dims, traditional,"
            " base) with the offset as an mx.array where gpu_paths() or traditional "
            "(rotate_halves rotates halves, a traditional RoPE neighbours); else "
            "rotate_halves_compiled(x, *self.rows(offset, L))"
        )

    def rows(self, offset: int | mx.array, length: int) -> tuple[mx.array, mx.array]:
        """cos, sin: [1 or B, 1, L, D / 2] at positions offset .. offset + L - 1."""
        raise NotImplementedError(
            "Week 2 Day 3 Task 3: FastRope.rows: unless the last call had the "
            "same_offset and length, gather the table's rows at offset.reshape(-1, 1)"
            " + arange(length) and keep them"
        )
        # ANCHOR_END: fast_rope


def check_offset(offset: int | list[int] | mx.array, cache: TinyKvCache) -> None:
    """Raise ValueError unless `offset` is the number of tokens the cache holds.

    Two counts meet in a step: RoPE rotates the new tokens to `offset`, while the
    cache stores them, and builds the mask, after its own `cache.offset` tokens.
    When they differ the output is quietly wrong, so an off-by-one stops here.
    offset: an int, or one per row. A TinyKvFullCache holds one count for all its
    rows; a BatchingKvCache one per row, and an empty row (0 tokens) runs a dummy
    token at any position.
    """
    raise NotImplementedError(
        "Week 2 Day 1 Task 2: check_offset: compare each row's offset (an int is "
        "every row's) with cache.offset and raise ValueError naming both numbers, "
        "e.g. 'offset 7 (row 0) does not match the KV cache, which holds 6 tokens'. "
        "Day 5: a BatchingKvCache's offset is a list, one count per row; skip its "
        "empty rows (count 0)"
    )


class WeightLoader:
    """Turns mlx-lm layers into this model's weights: dense in `dtype`, or quantized."""

    def __init__(self, quantized: bool, dtype: mx.Dtype):
        raise NotImplementedError(
            "Week 2 Day 1 Task 2: WeightLoader: keep `quantized` (always False until "
            "Day 2) and the dtype of the dense weights"
        )

    def weight(self, layer: nn.Module) -> Weight:
        raise NotImplementedError(
            "Week 2 Day 1 Task 2: WeightLoader.weight: dequantize_linear(layer, "
            'dtype). Day 2: when quantized and "scales" in layer, '
            "QuantizedWeights.from_mlx_layer(layer) instead"
        )

    def bias(self, layer: nn.Module) -> mx.array | None:
        raise NotImplementedError(
            'Week 2 Day 1 Task 2: WeightLoader.bias: layer["bias"] in dtype, or None '
            "when the layer has no bias"
        )
