"""Weights as mlx-lm loads them, turned into what the hand-written models use: a float
matrix (dequantize_linear) or the packed parts of a quantized one (QuantizedWeights),
plus the checks that a checkpoint's architecture is one the course implements."""

from dataclasses import dataclass

import mlx.core as mx
from mlx import nn

from .device import gpu_paths

DEFAULT_MAX_SEQ_LEN = 32768


# ANCHOR: dequantize_linear
def dequantize_linear(layer: nn.Module, dtype: mx.Dtype | None = None) -> mx.array:
    """The float weight of an mlx-lm (Quantized)Linear or (Quantized)Embedding.

    Returns [out, in] for a linear layer, [vocab, dim] for an embedding, in dtype
    (default: the layer's own float dtype). A quantized layer stores packed
    integers q plus a scale and a bias per group of group_size weights, and each
    weight is scale * q + bias. mx.dequantize computes that in the scales' dtype, so
    the scales and biases are cast to dtype first: float16 arithmetic would round
    every weight before it reaches a float32 model.
    """
    if "scales" not in layer:
        return layer.weight if dtype is None else layer.weight.astype(dtype)
    if layer.mode != "affine":
        raise ValueError(
            f"{layer.mode} quantization is not supported: use an affine-quantized "
            "or unquantized model"
        )
    dtype = dtype or layer.scales.dtype
    weight = mx.dequantize(
        layer.weight,
        layer.scales.astype(dtype),
        layer.biases.astype(dtype),
        group_size=layer.group_size,
        bits=layer.bits,
    )
    return weight
    # ANCHOR_END: dequantize_linear


def check_supported_architecture(args) -> None:
    """Raise ValueError naming what to change if mlx-lm's ModelArgs use a feature the
    hand-written Qwen2/Llama models do not implement (rope_scaling, MLP biases)."""
    if args.rope_scaling is not None:
        raise ValueError(
            f"this model uses rope_scaling {args.rope_scaling}, which tiny-llm's "
            "RoPE does not implement: pick a model without rope_scaling"
        )
    if getattr(args, "mlp_bias", False):
        raise ValueError("MLP biases are not supported: pick a model without mlp_bias")


@dataclass(frozen=True)
class QuantizedWeights:
    """A quantized matrix as MLX stores it, with what is needed to read it back.

    weight: [N, K * bits / 32] uint32; scales, biases: [N, K / group_size].
    A QuantizedLinear's own additive `bias` (Qwen2's q/k/v) is not part of this.
    """

    weight: mx.array
    scales: mx.array
    biases: mx.array
    group_size: int
    bits: int

    @classmethod
    def from_mlx_layer(
        cls, layer: nn.QuantizedLinear | nn.QuantizedEmbedding
    ) -> "QuantizedWeights":
        """The packed weight, scales, biases, group size and bits of an mlx layer."""
        mode = getattr(layer, "mode", "affine")
        if mode != "affine":
            raise ValueError(
                f"{type(layer).__name__} uses mode={mode!r}; only affine "
                "quantization (scale * q + bias) is supported"
            )
        return cls(
            layer.weight, layer.scales, layer.biases, layer.group_size, layer.bits
        )


def choose_weight_format(device: mx.Device | None = None) -> str:
    """How to keep linear weights on `device` (default: the device paths this run
    takes, tiny_llm_base.device.gpu_paths()).

    "float32" on the CPU: dequantize once at load time. MLX's CPU kernels for
    quantized and half-precision matmul do not use BLAS, while float32 matmul runs
    on OpenBLAS; the benchmark in scripts/bench/bench_quantized.py (table in the book's
    week 2 day 2 chapter) measured float32 fastest on this course's CPUs, for
    decode (M=1) and prefill (M=128) alike.
    "quantized" on a GPU (Metal or CUDA): decode is bound by memory bandwidth and
    a 4-bit weight is about 6x fewer bytes to read than float32, so keep weights
    quantized and call quantized_matmul.
    """
    on_gpu = gpu_paths() if device is None else device.type == mx.gpu
    return "quantized" if on_gpu else "float32"
