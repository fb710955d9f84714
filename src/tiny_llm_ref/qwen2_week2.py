"""Qwen2 with a KV cache: each call runs only the new tokens.

`model(inputs [B, L], offset, cache) -> logits [B, L, V]`: offset is the absolute
position of inputs[:, 0] (an int, or one int per row when rows are at different
points of their sequences), and cache holds one TinyKvCache per layer. The cache
returns this step's mask, so a whole prompt, a prefill chunk and a decode step all
go through the same code.

Two switches: `weights` keeps linear layers dequantized ("float32") or quantized
("quantized", run by quantized_matmul), "auto" picks per device; `use_fast_kernels`
swaps the hand-written RMSNorm, RoPE, attention and quantized matmul for mx.fast's
fused kernels, and on a CPU attention for cpu_attention (week 2 day 3). The
operations a block calls, both paths of each, are in qwen2_ops.py.
"""

from collections.abc import Callable

import mlx.core as mx
from mlx import nn

from tiny_llm_base import (
    DEFAULT_MAX_SEQ_LEN,
    check_supported_architecture,
    choose_weight_format,
    dequantize_linear,
)

from .attention import scaled_dot_product_attention_grouped
from .basics import silu
from .embedding import Embedding
from .kv_cache import TinyKvCache, TinyKvFullCache
from .layer_norm import RMSNorm
from .positional_encoding import RoPE
from .qwen2_ops import (
    FastRope,
    Weight,
    WeightLoader,
    check_offset,
    fast_attention,
    packed_rows,
    project,
    rms_norm,
    swiglu,
)

# attend(q, k, v) -> attention output: the per-sequence step of a block.
Attend = Callable[[mx.array, mx.array, mx.array], mx.array]
# The hand-written path's RoPE ([B, L, H, D]), or the fast path's ([B, H, L, D]).
Rope = RoPE | FastRope


class Qwen2AttentionWeek2:
    """Grouped-query attention over the cache: only this step's q, k, v are computed."""

    def __init__(
        self, layer: nn.Module, args, load: WeightLoader, rope: Rope, fast: bool
    ):
        # Week 2 Day 1 Task 2: Qwen2AttentionWeek2: head counts and head_dim (q_proj's
        # output size / num_attention_heads), wq wk wv wo and their biases (o_proj has
        # one in a Llama with attention_bias) through `load`, the shared rope. Day 3:
        # wqkv, bqkv = packed_rows of wq wk wv and their biases when fast (else None,
        # None); with a wqkv, wq wk wv become mx.split views of its rows
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
        self.fast = fast
        # Day 3: with fast, q, k, v in one product; wq wk wv become views of its rows,
        # so the weights are held once.
        weights, biases = [self.wq, self.wk, self.wv], [self.bq, self.bk, self.bv]
        packed = packed_rows(weights, biases) if fast else None
        self.wqkv, self.bqkv = packed or (None, None)
        if self.wqkv is not None:
            q_rows, kv_rows = self.wq.shape[0], self.wk.shape[0]
            self.wq, self.wk, self.wv = mx.split(self.wqkv, [q_rows, q_rows + kv_rows])

    def apply_rope(self, x: mx.array, offset: int | mx.array) -> mx.array:
        """x: [B, H, L, D] rotated to positions offset .. offset + L - 1."""
        # Week 2 Day 1 Task 2: apply_rope: your RoPE takes [B, L, H, D]: swap axes 1 and
        # 2 around it. Day 3: with fast, rope is the model's FastRope: [B, H, L, D]
        # directly
        if self.fast:
            return self.rope(x, offset)
        return self.rope(x.swapaxes(1, 2), offset).swapaxes(1, 2)

    def project_qkv(self, x: mx.array) -> tuple[mx.array, mx.array, mx.array]:
        """x: [B, L, E] -> q: [B, H_q, L, D], k and v: [B, H, L, D], not yet rotated.

        Each token is projected alone: tokens of different sequences can share a call.
        The products run on the rows [B * L, E]: a product of a 3-D x costs MLX two
        more operations (flatten, unflatten).
        """
        # Week 2 Day 1 Task 2: project_qkv: project x (as rows [B * L, E]) through
        # wq/wk/wv (with their biases), reshape to [B, L, heads, head_dim] and swap axes
        # 1 and 2. Day 3: with a wqkv, one product through it (and bqkv), reshaped
        # to all the heads, then cut into q, k, v along the heads
        B, L, E = x.shape
        rows = x.reshape(B * L, E)
        if self.wqkv is not None:
            h, kv = self.num_heads, self.num_kv_heads
            qkv = project(rows, self.wqkv, self.bqkv, self.fast)
            qkv = qkv.reshape(B, L, h + 2 * kv, self.head_dim).swapaxes(1, 2)
            return qkv[:, :h], qkv[:, h : h + kv], qkv[:, h + kv :]

        def heads(w: Weight, b: mx.array | None, n: int) -> mx.array:
            return (
                project(rows, w, b, self.fast)
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
        # Week 2 Day 1 Task 2: attend: RoPE on q and k at `offset`; keys, values, mask =
        # cache.update_and_fetch(k, v); then self.attention. Week 3 Day 2:
        # cache.stage(k, v), then cache.attend_staged(q, self.attention) (given: the
        # same for the caches before, and the paged decode rows attend in groups)
        q, k = self.apply_rope(q, offset), self.apply_rope(k, offset)
        cache.stage(k, v)
        return cache.attend_staged(q, self.attention)

    def attention(
        self, q: mx.array, keys: mx.array, values: mx.array, mask
    ) -> mx.array:
        """q: [B, H_q, L, D] (rotated) against keys/values [B, H, S, D] under `mask`
        -> [B, H_q, L, D]."""
        # Week 2 Day 1 Task 2: attention: grouped attention with scale and the mask. Day
        # 3: with fast, fast_attention
        attention = (
            fast_attention if self.fast else scaled_dot_product_attention_grouped
        )
        return attention(q, keys, values, scale=self.scale, mask=mask)

    def project_out(self, out: mx.array) -> mx.array:
        """out: [B, H_q, L, D] -> [B, L, E]: the heads side by side, through wo."""
        # Week 2 Day 1 Task 2: project_out: swap axes 1 and 2, reshape to rows [B * L,
        # H_q * D], project through wo (and its bias), reshape to [B, L, E]
        B, _, L, _ = out.shape
        rows = out.swapaxes(1, 2).reshape(B * L, -1)
        return project(rows, self.wo, self.bo, self.fast).reshape(B, L, -1)


class Qwen2BlockWeek2:
    """Pre-norm residual block: h = x + attention(norm(x)); out = h + mlp(norm(h))."""

    def __init__(
        self, layer: nn.Module, args, load: WeightLoader, rope: Rope, fast: bool
    ):
        # Week 2 Day 1 Task 2: Qwen2BlockWeek2: the attention, the MLP's gate/up/down
        # weights through `load`, the two RMSNorms. Day 3: w_gate_up = packed_rows of
        # w_gate and w_up when fast (else None); with it, w_gate and w_up become
        # mx.split views of its halves
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
        packed = packed_rows([self.w_gate, self.w_up], [None, None]) if fast else None
        self.w_gate_up = packed[0] if packed else None
        if self.w_gate_up is not None:
            self.w_gate, self.w_up = mx.split(self.w_gate_up, 2)

    def __call__(
        self, x: mx.array, offset: int | mx.array, cache: TinyKvCache
    ) -> mx.array:
        """x: [B, L, E] at positions offset .. offset + L - 1 -> [B, L, E]."""
        # Week 2 Day 1 Task 2: Qwen2BlockWeek2: self.forward(x, attend) with attend(q,
        # k, v) = self.attention.attend(q, k, v, offset, cache)
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
        # Week 2 Day 1 Task 2: forward: as week 1's block: h = x +
        # project_out(attend(*project_qkv(input_norm(x)))); out = h +
        # mlp(post_attention_norm(h)), the norms through rms_norm
        attention = self.attention
        q, k, v = attention.project_qkv(rms_norm(self.input_norm, x, self.fast))
        h = x + attention.project_out(attend(q, k, v))
        return h + self.mlp(rms_norm(self.post_attention_norm, h, self.fast))

    def mlp(self, y: mx.array) -> mx.array:
        """y: [B, L, E] -> [B, L, E]: silu(y w_gate) * (y w_up), then w_down, on the
        rows [B * L, E]."""
        # Week 2 Day 1 Task 2: mlp: as rows [B * L, E], project through w_gate and w_up,
        # silu(gate) * up, project through w_down, back to [B, L, E]. Day 3:
        # swiglu(gate, up) when fast; with a w_gate_up, one product through it, its
        # output cut in halves (gate, up)
        rows = y.reshape(-1, y.shape[-1])
        if self.w_gate_up is not None:
            both = project(rows, self.w_gate_up, fast=self.fast)
            gate, up = mx.split(both, 2, axis=-1)
        else:
            gate = project(rows, self.w_gate, fast=self.fast)
            up = project(rows, self.w_up, fast=self.fast)
        hidden = swiglu(gate, up) if self.fast else silu(gate) * up
        return project(hidden, self.w_down, fast=self.fast).reshape(y.shape)


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
        # Week 2 Day 1 Task 2: Qwen2ModelWeek2: as week 1's model, with
        # weights='float32' (dequantized to float32; an unquantized checkpoint keeps its
        # dtype), one RoPE shared by the layers (Day 3: with use_fast_kernels, one
        # FastRope(rope, rope_theta) instead), and use_fast_kernels kept for Day 3;
        # keep vocab_size (args.vocab_size) and context_length
        # (args.max_position_embeddings, or DEFAULT_MAX_SEQ_LEN when None: also the RoPE
        # table's length) for Day 6's requests. Day 2: 'auto' asks
        # choose_weight_format(), 'quantized' keeps packed weights, anything else is a
        # ValueError
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
        if use_fast_kernels:
            rope = FastRope(rope, args.rope_theta)
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
        # Week 2 Day 1 Task 2: create_kv_cache: one TinyKvFullCache per layer
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
        # Week 2 Day 1 Task 2: Qwen2ModelWeek2: check_offset(offset, layer_cache) for
        # every layer first; a list offset becomes an mx.array; embed, run every layer
        # with its own cache, then self.logits on every position, or on h[:, -1:] with
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
        # Week 2 Day 1 Task 2: logits: rms_norm with the final norm, then the lm head
        # (the embedding's as_linear when tied)
        h = rms_norm(self.norm, h, self.fast)
        if self.lm_head is None:
            return self.embedding.as_linear(h)
        return project(h, self.lm_head, fast=self.fast)
