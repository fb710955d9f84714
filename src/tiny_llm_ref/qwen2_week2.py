"""Qwen2 with a KV cache: each call runs only the new tokens.

`model(inputs [B, L], offset, cache) -> logits [B, L, V]`: offset is the absolute
position of inputs[:, 0] (an int, or one int per row when rows are at different
points of their sequences), and cache holds one TinyKvCache per layer. The cache
returns this step's mask, so a whole prompt, a prefill chunk and a decode step all
go through the same code.

Two switches: `weights` keeps linear layers dequantized ("float32") or quantized
("quantized", run by quantized_matmul), "auto" picks per device; `use_fast_kernels`
swaps the hand-written RMSNorm, RoPE, attention and quantized matmul for mx.fast's
fused kernels, and on a CPU attention for cpu_attention (week 2 day 3).
"""

from collections.abc import Callable

import mlx.core as mx
from mlx import nn

from tiny_llm_base import (
    DEFAULT_MAX_SEQ_LEN,
    QuantizedWeights,
    check_supported_architecture,
    choose_weight_format,
    dequantize_linear,
)

from .attention import scaled_dot_product_attention_grouped
from .basics import linear, silu
from .cpu_kernels import cpu_attention, fast_exp
from .embedding import Embedding
from .kv_cache import TinyKvCache, TinyKvFullCache
from .layer_norm import RMSNorm
from .positional_encoding import RoPE
from .quantize import quantized_matmul

Weight = mx.array | QuantizedWeights
# attend(q, k, v) -> attention output: the per-sequence step of a block.
Attend = Callable[[mx.array, mx.array, mx.array], mx.array]


def project(
    x: mx.array, w: Weight, bias: mx.array | None = None, fast: bool = False
) -> mx.array:
    """x: [..., in] -> [..., out] through a dense [out, in] or a quantized weight."""
    # Week 2 Day 1: project: linear(x, w, bias) for a dense weight. Day 2: a
    # QuantizedWeights w goes through quantized_matmul(w.scales, w.biases, w.group_size,
    # w.bits, x, w.weight). Day 3: with fast, mx.quantized_matmul
    if isinstance(w, mx.array):
        return linear(x, w, bias)
    if fast:
        out = mx.quantized_matmul(
            x,
            w.weight,
            w.scales,
            w.biases,
            transpose=True,
            group_size=w.group_size,
            bits=w.bits,
        )
    else:
        out = quantized_matmul(w.scales, w.biases, w.group_size, w.bits, x, w.weight)
    return out if bias is None else out + bias


# ANCHOR: swiglu
@mx.compile
def swiglu_fast_exp(gate: mx.array, up: mx.array) -> mx.array:
    """silu(gate) * up, [..., hidden]: compiled, with the sigmoid's exp from fast_exp.

    silu(x) = x * sigmoid(x) = x / (1 + exp(-x)); exp(-x) = inf for x below -88
    gives -0, the limit. The result keeps gate's dtype.
    """
    # Week 2 Day 3: swiglu_fast_exp: silu(gate) * up as gate / (1 + fast_exp(-gate))
    # (back in gate's dtype) times up, decorated with @mx.compile so the elementwise
    # ops run as fused loops
    return (gate / (1.0 + fast_exp(-gate))).astype(gate.dtype) * up


def swiglu(gate: mx.array, up: mx.array) -> mx.array:
    """silu(gate) * up, [..., hidden]: swiglu_fast_exp on the CPU, silu(gate) * up
    elsewhere. fast_exp rounds by adding and subtracting 1.5 * 2^23, which only
    strict float arithmetic keeps; a GPU's fast-math compiler may fold it away, and
    a GPU's own exp is fast anyway."""
    # Week 2 Day 3: swiglu: swiglu_fast_exp on the CPU (mx.default_device()), else
    # silu(gate) * up
    if mx.default_device().type == mx.cpu:
        return swiglu_fast_exp(gate, up)
    return silu(gate) * up
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
    # Week 2 Day 3: fast_attention: mx.fast.scaled_dot_product_attention(q, k, v,
    # scale=scale, mask=mask) passes the tests; then, on the CPU, cpu_attention(q, k,
    # v, scale, mask)
    if mx.default_device().type == mx.cpu:
        return cpu_attention(q, k, v, scale, mask)
    return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)
    # ANCHOR_END: fast_attention


def rms_norm(norm: RMSNorm, x: mx.array, fast: bool = False) -> mx.array:
    """x: [..., dim] normalized by `norm`, by hand or by mx.fast.rms_norm.

    RMSNorm keeps its weight in float32; mx.fast.rms_norm gets it in x's dtype so
    that, like the hand-written norm, it returns x's dtype (a float32 weight would
    promote a bfloat16 model's activations to float32).
    """
    # Week 2 Day 1: rms_norm: norm(x). Day 3: with fast, mx.fast.rms_norm(x,
    # norm.weight.astype(x.dtype), norm.eps)
    if fast:
        return mx.fast.rms_norm(x, norm.weight.astype(x.dtype), norm.eps)
    return norm(x)


def check_offset(offset: int | list[int] | mx.array, cache: TinyKvCache) -> None:
    """Raise ValueError unless `offset` is the number of tokens the cache holds.

    Two counts meet in a step: RoPE rotates the new tokens to `offset`, while the
    cache stores them, and builds the mask, after its own `cache.offset` tokens.
    When they differ the output is quietly wrong, so an off-by-one stops here.
    offset: an int, or one per row. A TinyKvFullCache holds one count for all its
    rows; a BatchingKvCache one per row, and an empty row (0 tokens) runs a dummy
    token at any position.
    """
    # Week 2 Day 1: check_offset: compare each row's offset (an int is every row's) with
    # cache.offset and raise ValueError naming both numbers, e.g. 'offset 7 (row 0) does
    # not match the KV cache, which holds 6 tokens'. Day 5: a BatchingKvCache's offset
    # is a list, one count per row; skip its empty rows (count 0)
    counts = cache.offset
    per_row = isinstance(counts, list)
    given = (
        [offset] if isinstance(offset, int) else mx.array(offset).reshape(-1).tolist()
    )
    if not per_row:
        counts = [counts] * len(given)
    elif len(given) == 1:
        given = given * len(counts)
    for row, (position, count) in enumerate(zip(given, counts)):
        if position != count and not (per_row and count == 0):
            raise ValueError(
                f"offset {position} (row {row}) does not match the KV cache, which "
                f"holds {count} tokens: a step's offset is the number of tokens "
                "already in its cache"
            )


class WeightLoader:
    """Turns mlx-lm layers into this model's weights: dense in `dtype`, or quantized."""

    def __init__(self, quantized: bool, dtype: mx.Dtype):
        # Week 2 Day 1: WeightLoader: keep `quantized` (always False until Day 2) and
        # the dtype of the dense weights
        self.quantized = quantized
        self.dtype = dtype

    def weight(self, layer: nn.Module) -> Weight:
        # Week 2 Day 1: WeightLoader.weight: dequantize_linear(layer, dtype). Day 2:
        # when quantized and "scales" in layer, QuantizedWeights.from_mlx_layer(layer)
        # instead
        if self.quantized and "scales" in layer:
            return QuantizedWeights.from_mlx_layer(layer)
        return dequantize_linear(layer, self.dtype)

    def bias(self, layer: nn.Module) -> mx.array | None:
        # Week 2 Day 1: WeightLoader.bias: layer["bias"] in dtype, or None when the
        # layer has no bias
        return layer["bias"].astype(self.dtype) if "bias" in layer else None


class Qwen2AttentionWeek2:
    """Grouped-query attention over the cache: only this step's q, k, v are computed."""

    def __init__(
        self, layer: nn.Module, args, load: WeightLoader, rope: RoPE, fast: bool
    ):
        # Week 2 Day 1: Qwen2AttentionWeek2: head counts and head_dim (q_proj's output
        # size / num_attention_heads), wq wk wv wo and their biases (o_proj has one in a
        # Llama with attention_bias) through `load`, the shared rope
        self.num_heads = args.num_attention_heads
        self.num_kv_heads = args.num_key_value_heads
        self.head_dim = layer.q_proj.weight.shape[0] // self.num_heads
        self.scale = self.head_dim**-0.5
        self.wq, self.wk, self.wv, self.wo = (
            load.weight(p)
            for p in (layer.q_proj, layer.k_proj, layer.v_proj, layer.o_proj)
        )
        # Qwen2 has q/k/v biases; a Llama with attention_bias has an o_proj bias too.
        self.bq, self.bk, self.bv, self.bo = (
            load.bias(p)
            for p in (layer.q_proj, layer.k_proj, layer.v_proj, layer.o_proj)
        )
        self.rope = rope
        self.rope_base = args.rope_theta
        self.fast = fast

    def apply_rope(self, x: mx.array, offset: int | mx.array) -> mx.array:
        """x: [B, H, L, D] rotated to positions offset .. offset + L - 1."""
        # Week 2 Day 1: apply_rope: your RoPE takes [B, L, H, D]: swap axes 1 and 2
        # around it. Day 3: with fast, mx.fast.rope(x, head_dim, traditional=...,
        # base=rope_theta, scale=1.0, offset=offset) on [B, H, L, D] directly
        if self.fast:
            return mx.fast.rope(
                x,
                self.head_dim,
                traditional=self.rope.traditional,
                base=self.rope_base,
                scale=1.0,
                offset=offset,
            )
        return self.rope(x.swapaxes(1, 2), offset).swapaxes(1, 2)

    def project_qkv(self, x: mx.array) -> tuple[mx.array, mx.array, mx.array]:
        """x: [B, L, E] -> q: [B, H_q, L, D], k and v: [B, H, L, D], not yet rotated.

        Each token is projected alone: tokens of different sequences can share a call.
        """
        # Week 2 Day 1: project_qkv: project x through wq/wk/wv (with their biases),
        # reshape to [B, L, heads, head_dim] and swap axes 1 and 2
        B, L, _ = x.shape

        def heads(w: Weight, b: mx.array | None, n: int) -> mx.array:
            return (
                project(x, w, b, self.fast)
                .reshape(B, L, n, self.head_dim)
                .swapaxes(1, 2)
            )

        return (
            heads(self.wq, self.bq, self.num_heads),
            heads(self.wk, self.bk, self.num_kv_heads),
            heads(self.wv, self.bv, self.num_kv_heads),
        )

    def attend(
        self,
        q: mx.array,
        k: mx.array,
        v: mx.array,
        offset: int | mx.array,
        cache: TinyKvCache,
    ) -> mx.array:
        """q: [B, H_q, L, D], k and v: [B, H, L, D] at positions offset .. offset + L - 1
        -> [B, H_q, L, D].

        The one step where tokens meet: RoPE at their positions, the keys and values
        stored in the cache, and attention to everything it holds under its mask.
        """
        # Week 2 Day 1: attend: RoPE on q and k at `offset`; keys, values, mask =
        # cache.update_and_fetch(k, v); then self.attention
        q, k = self.apply_rope(q, offset), self.apply_rope(k, offset)
        return self.attention(q, *cache.update_and_fetch(k, v))

    def attention(
        self, q: mx.array, keys: mx.array, values: mx.array, mask
    ) -> mx.array:
        """q: [B, H_q, L, D] (rotated) against keys/values [B, H, S, D] under `mask`
        -> [B, H_q, L, D]."""
        # Week 2 Day 1: attention: grouped attention with scale and the mask. Day 3:
        # with fast, fast_attention
        attention = (
            fast_attention if self.fast else scaled_dot_product_attention_grouped
        )
        return attention(q, keys, values, scale=self.scale, mask=mask)

    def project_out(self, out: mx.array) -> mx.array:
        """out: [B, H_q, L, D] -> [B, L, E]: the heads side by side, through wo."""
        # Week 2 Day 1: project_out: swap axes 1 and 2, reshape to [B, L, H_q * D],
        # project through wo (and its bias)
        B, _, L, _ = out.shape
        return project(
            out.swapaxes(1, 2).reshape(B, L, -1), self.wo, self.bo, self.fast
        )


class Qwen2BlockWeek2:
    """Pre-norm residual block: h = x + attention(norm(x)); out = h + mlp(norm(h))."""

    def __init__(
        self, layer: nn.Module, args, load: WeightLoader, rope: RoPE, fast: bool
    ):
        # Week 2 Day 1: Qwen2BlockWeek2: the attention, the MLP's gate/up/down weights
        # through `load`, the two RMSNorms
        self.attention = Qwen2AttentionWeek2(layer.self_attn, args, load, rope, fast)
        mlp = layer.mlp
        self.w_gate, self.w_up, self.w_down = (
            load.weight(p) for p in (mlp.gate_proj, mlp.up_proj, mlp.down_proj)
        )
        self.input_norm = RMSNorm(
            args.hidden_size, layer.input_layernorm.weight, args.rms_norm_eps
        )
        self.post_attention_norm = RMSNorm(
            args.hidden_size, layer.post_attention_layernorm.weight, args.rms_norm_eps
        )
        self.fast = fast

    def __call__(
        self, x: mx.array, offset: int | mx.array, cache: TinyKvCache
    ) -> mx.array:
        """x: [B, L, E] at positions offset .. offset + L - 1 -> [B, L, E]."""
        # Week 2 Day 1: Qwen2BlockWeek2: self.forward(x, attend) with attend(q, k, v) =
        # self.attention.attend(q, k, v, offset, cache)
        return self.forward(
            x, lambda q, k, v: self.attention.attend(q, k, v, offset, cache)
        )

    def forward(self, x: mx.array, attend: Attend) -> mx.array:
        """x: [B, L, E] -> [B, L, E], with attention's middle step given.

        attend(q, k, v) -> [B, H_q, L, D] is the only step where a token sees other
        tokens; the norms, projections and MLP work on each token alone. So tokens
        of different sequences can share one call, if attend gives each sequence's
        tokens their own positions and cache (the mixed step, week 3 day 1).
        """
        # Week 2 Day 1: forward: as week 1's block: h = x +
        # project_out(attend(*project_qkv(input_norm(x)))); out = h +
        # MLP(post_attention_norm(h)), the norms through rms_norm. Day 3: swiglu when
        # fast
        attention = self.attention
        q, k, v = attention.project_qkv(rms_norm(self.input_norm, x, self.fast))
        h = x + attention.project_out(attend(q, k, v))
        y = rms_norm(self.post_attention_norm, h, self.fast)
        gate, up = (
            project(y, self.w_gate, fast=self.fast),
            project(y, self.w_up, fast=self.fast),
        )
        hidden = swiglu(gate, up) if self.fast else silu(gate) * up
        return h + project(hidden, self.w_down, fast=self.fast)


class Qwen2ModelWeek2:
    """A hand-written mlx-lm qwen2/llama model with a KV cache.

    weights: "float32" dequantizes linear layers once (fastest on CPUs, where float32
    matmul uses BLAS), "quantized" keeps quantized layers packed, "auto" asks
    choose_weight_format() for this device. use_fast_kernels: mx.fast instead of the
    hand-written kernels (same results within float tolerance). vocab_size and
    context_length bound the token ids and positions it accepts.
    """

    def __init__(
        self,
        mlx_model: nn.Module,
        weights: str = "auto",
        use_fast_kernels: bool = False,
    ):
        # Week 2 Day 1: Qwen2ModelWeek2: as week 1's model, with weights='float32'
        # (dequantized to float32; an unquantized checkpoint keeps its dtype), one RoPE
        # shared by the layers, and use_fast_kernels kept for Day 3; keep vocab_size
        # (args.vocab_size) and context_length (args.max_position_embeddings, or
        # DEFAULT_MAX_SEQ_LEN when None: also the RoPE table's length) for Day 6's
        # requests. Day 2: 'auto' asks choose_weight_format(), 'quantized' keeps packed
        # weights, anything else is a ValueError
        if weights == "auto":
            weights = choose_weight_format()
        if weights not in ("float32", "quantized"):
            raise ValueError(
                f"weights must be 'auto', 'float32' or 'quantized', not {weights!r}"
            )
        args = mlx_model.args
        check_supported_architecture(args)
        inner = mlx_model.model
        # "float32" dequantizes a quantized checkpoint to float32; an unquantized
        # checkpoint, and "quantized" weights, keep the dtype the checkpoint computes in.
        to_float32 = weights == "float32" and "scales" in inner.embed_tokens
        dtype = mx.float32 if to_float32 else inner.norm.weight.dtype
        load = WeightLoader(weights == "quantized", dtype)
        self.args = args
        self.num_layers = len(inner.layers)
        self.vocab_size = args.vocab_size
        # The positions it was trained for (a llama config may leave them out).
        self.context_length = args.max_position_embeddings or DEFAULT_MAX_SEQ_LEN
        self.weights = weights
        self.embedding = Embedding(
            args.vocab_size,
            args.hidden_size,
            dequantize_linear(inner.embed_tokens, dtype),
        )
        head_dim = inner.layers[0].self_attn.q_proj.weight.shape[0] // (
            args.num_attention_heads
        )
        # One RoPE table, shared by every layer.
        rope = RoPE(
            head_dim,
            self.context_length,
            args.rope_theta,
            args.rope_traditional,
        )
        self.layers = [
            Qwen2BlockWeek2(layer, args, load, rope, use_fast_kernels)
            for layer in inner.layers
        ]
        self.norm = RMSNorm(args.hidden_size, inner.norm.weight, args.rms_norm_eps)
        self.lm_head = (
            None if args.tie_word_embeddings else load.weight(mlx_model.lm_head)
        )
        self.fast = use_fast_kernels

    def create_kv_cache(self) -> list[TinyKvFullCache]:
        """One empty cache per layer."""
        # Week 2 Day 1: create_kv_cache: one TinyKvFullCache per layer
        return [TinyKvFullCache() for _ in range(self.num_layers)]

    def __call__(
        self,
        inputs: mx.array,
        offset: int | list[int] | mx.array,
        cache: list[TinyKvCache],
        last_position_only: bool = False,
    ) -> mx.array:
        """inputs: [B, L] -> logits [B, L, V], or [B, 1, V] with last_position_only.

        offset: the position of inputs[:, 0], an int or one int per row; it must be
        what each layer's cache holds (check_offset). A prefill chunk samples only
        after its last token: last_position_only skips the LM head on the other
        L - 1 positions, which would cost L x V floats.
        """
        # Week 2 Day 1: Qwen2ModelWeek2: check_offset(offset, layer_cache) for every
        # layer first; a list offset becomes an mx.array; embed, run every layer with
        # its own cache, then self.logits on every position, or on h[:, -1:] with
        # last_position_only
        for layer_cache in cache:
            check_offset(offset, layer_cache)
        if not isinstance(offset, int):
            offset = mx.array(offset)
        h = self.embedding(inputs)
        for layer, layer_cache in zip(self.layers, cache):
            h = layer(h, offset, layer_cache)
        return self.logits(h[:, -1:, :] if last_position_only else h)

    def logits(self, h: mx.array) -> mx.array:
        """h: [..., E] -> [..., V]: the final norm, then the LM head (the embedding
        matrix when the two are tied)."""
        # Week 2 Day 1: logits: rms_norm with the final norm, then the lm head (the
        # embedding's as_linear when tied)
        h = rms_norm(self.norm, h, self.fast)
        if self.lm_head is None:
            return self.embedding.as_linear(h)
        return project(h, self.lm_head, fast=self.fast)
