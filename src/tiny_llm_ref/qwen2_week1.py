"""Qwen2 (and Llama, the same architecture without q/k/v biases), written by hand.

The weights come from a model mlx-lm loaded; everything that runs them is here.
Week 1 has no cache: every call recomputes attention over the whole sequence.
"""

import mlx.core as mx
from mlx import nn

from tiny_llm_base import (
    DEFAULT_MAX_SEQ_LEN,
    check_supported_architecture,
    dequantize_linear,
)

from .attention import scaled_dot_product_attention_grouped
from .basics import linear, silu
from .embedding import Embedding
from .layer_norm import RMSNorm
from .positional_encoding import RoPE


class Qwen2MLP:
    """SwiGLU feed-forward: down(silu(gate(x)) * up(x)).

    w_gate, w_up: [hidden_dim, dim], w_down: [dim, hidden_dim]. The gate decides,
    per hidden unit, how much of up(x) passes.
    """

    def __init__(
        self,
        dim: int,
        hidden_dim: int,
        w_gate: mx.array,
        w_up: mx.array,
        w_down: mx.array,
    ):
        # Week 1 Day 4 Task 2: Qwen2MLP.__init__ (keep the weights)
        self.dim = dim
        self.hidden_dim = hidden_dim
        self.w_gate, self.w_up, self.w_down = w_gate, w_up, w_down

    def __call__(self, x: mx.array) -> mx.array:
        """x: [..., dim] -> [..., dim]."""
        # Week 1 Day 4 Task 2: Qwen2MLP (down(silu(gate x) * up x))
        return linear(silu(linear(x, self.w_gate)) * linear(x, self.w_up), self.w_down)


class Qwen2MultiHeadAttention:
    """Causal grouped-query self-attention with RoPE on q and k.

    wq: [H_q * D, E], wk and wv: [H * D, E], wo: [E, H_q * D]; biases optional
    (Qwen2 has them on q, k, v; Llama usually has none).
    """

    def __init__(
        self,
        num_heads: int,
        num_kv_heads: int,
        wq: mx.array,
        wk: mx.array,
        wv: mx.array,
        wo: mx.array,
        rope: RoPE,
        bq: mx.array | None = None,
        bk: mx.array | None = None,
        bv: mx.array | None = None,
        bo: mx.array | None = None,
    ):
        # Week 1 Day 5 Task 2: Qwen2MultiHeadAttention.__init__
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = wq.shape[0] // num_heads
        self.wq, self.wk, self.wv, self.wo = wq, wk, wv, wo
        self.bq, self.bk, self.bv, self.bo = bq, bk, bv, bo
        self.rope = rope

    def __call__(self, x: mx.array) -> mx.array:
        """x: [B, L, E] -> [B, L, E]; position p attends to positions 0 .. p."""
        # Week 1 Day 5 Task 2: Qwen2MultiHeadAttention
        batch, length, _ = x.shape
        q = linear(x, self.wq, self.bq).reshape(batch, length, self.num_heads, -1)
        k = linear(x, self.wk, self.bk).reshape(batch, length, self.num_kv_heads, -1)
        v = linear(x, self.wv, self.bv).reshape(batch, length, self.num_kv_heads, -1)
        q, k = self.rope(q), self.rope(k)
        out = scaled_dot_product_attention_grouped(
            q.swapaxes(1, 2),  # [B, H_q, L, D]
            k.swapaxes(1, 2),
            v.swapaxes(1, 2),
            scale=self.head_dim**-0.5,
            mask="causal",
        )
        return linear(out.swapaxes(1, 2).reshape(batch, length, -1), self.wo, self.bo)


class Qwen2TransformerBlock:
    """Pre-norm residual block: h = x + attention(norm(x)); out = h + mlp(norm(h))."""

    def __init__(
        self,
        attention: Qwen2MultiHeadAttention,
        mlp: Qwen2MLP,
        input_norm: RMSNorm,
        post_attention_norm: RMSNorm,
    ):
        # Week 1 Day 5 Task 2: Qwen2TransformerBlock.__init__
        self.attention = attention
        self.mlp = mlp
        self.input_norm = input_norm
        self.post_attention_norm = post_attention_norm

    def __call__(self, x: mx.array) -> mx.array:
        """x: [B, L, E] -> [B, L, E]."""
        # Week 1 Day 5 Task 2: Qwen2TransformerBlock (two residual branches)
        h = x + self.attention(self.input_norm(x))
        return h + self.mlp(self.post_attention_norm(h))


class Qwen2ModelWeek1:
    """A hand-written copy of an mlx-lm qwen2 or llama model: inputs [B, L] -> logits.

    Quantized layers are dequantized once, here. All weights take the dtype of the
    model's unquantized parameters, its norms: that is the precision the checkpoint
    computes in (bfloat16 for a bfloat16 checkpoint). The embedded model's norms are
    float32, and so is its model: float32 matmuls go through the fast BLAS, while
    float16 ones (its quantization scales' dtype) are slow on a CPU.
    """

    def __init__(self, mlx_model: nn.Module):
        """Copy the weights out of mlx_model.

        mlx_model.args has the sizes (hidden_size, num_attention_heads,
        num_key_value_heads, rms_norm_eps, rope_theta, rope_traditional,
        max_position_embeddings (may be None), tie_word_embeddings).
        mlx_model.model has embed_tokens, layers[i].self_attn.{q,k,v,o}_proj,
        layers[i].mlp.{gate,up,down}_proj, layers[i].input_layernorm,
        layers[i].post_attention_layernorm and norm; mlx_model.lm_head exists when
        the embeddings are not tied. Given by tiny_llm_base:
        `check_supported_architecture(args)` raises for what the course does not
        implement (call it first); `dequantize_linear(layer, dtype)` gives any of
        those layers' weight as a float array. A layer has a bias when "bias" in
        layer. The head dim is q_proj's output size / num_attention_heads; RoPE's
        table covers max_position_embeddings or DEFAULT_MAX_SEQ_LEN positions.
        """
        # Week 1 Day 5 Task 3: Qwen2ModelWeek1.__init__ (copy the weights)
        args = mlx_model.args
        check_supported_architecture(args)
        inner = mlx_model.model
        self.dtype = inner.norm.weight.dtype
        self.vocab_size = args.vocab_size
        self.embedding = Embedding(
            args.vocab_size, args.hidden_size, self._weight(inner.embed_tokens)
        )
        head_dim = getattr(args, "head_dim", None) or (
            args.hidden_size // args.num_attention_heads
        )
        # One RoPE table, shared by every layer.
        rope = RoPE(
            head_dim,
            args.max_position_embeddings or DEFAULT_MAX_SEQ_LEN,
            base=args.rope_theta,
            traditional=args.rope_traditional,
        )
        self.layers = [self._block(layer, args, rope) for layer in inner.layers]
        self.norm = RMSNorm(args.hidden_size, inner.norm.weight, eps=args.rms_norm_eps)
        self.lm_head = (
            None if args.tie_word_embeddings else self._weight(mlx_model.lm_head)
        )

    def _weight(self, layer: nn.Module) -> mx.array:
        # Week 1 Day 5 Task 3: _weight: the layer's weight as a float array of
        # self.dtype (dequantize_linear), evaluated now
        weight = dequantize_linear(layer, self.dtype)
        mx.eval(weight)  # dequantize now, once, not lazily inside the first forward
        return weight

    def _bias(self, layer: nn.Module) -> mx.array | None:
        # Week 1 Day 5 Task 3: _bias: the layer's bias in self.dtype, or None when it
        # has none
        return layer["bias"].astype(self.dtype) if "bias" in layer else None

    def _block(self, layer: nn.Module, args, rope: RoPE) -> Qwen2TransformerBlock:
        # Week 1 Day 5 Task 3: _block: one Qwen2TransformerBlock from an mlx-lm layer
        # (attention with its biases, MLP, the two norms)
        attn, mlp = layer.self_attn, layer.mlp
        attention = Qwen2MultiHeadAttention(
            args.num_attention_heads,
            args.num_key_value_heads,
            self._weight(attn.q_proj),
            self._weight(attn.k_proj),
            self._weight(attn.v_proj),
            self._weight(attn.o_proj),
            rope=rope,
            bq=self._bias(attn.q_proj),
            bk=self._bias(attn.k_proj),
            bv=self._bias(attn.v_proj),
            bo=self._bias(attn.o_proj),
        )
        feed_forward = Qwen2MLP(
            args.hidden_size,
            args.intermediate_size,
            self._weight(mlp.gate_proj),
            self._weight(mlp.up_proj),
            self._weight(mlp.down_proj),
        )
        eps = args.rms_norm_eps
        return Qwen2TransformerBlock(
            attention,
            feed_forward,
            RMSNorm(args.hidden_size, layer.input_layernorm.weight, eps=eps),
            RMSNorm(args.hidden_size, layer.post_attention_layernorm.weight, eps=eps),
        )

    def __call__(self, inputs: mx.array) -> mx.array:
        """inputs: [B, L] token ids -> logits [B, L, vocab_size], causal, no cache."""
        # Week 1 Day 5 Task 3: Qwen2ModelWeek1 (embed, blocks, norm, head)
        h = self.embedding(inputs)
        for layer in self.layers:
            h = layer(h)
        h = self.norm(h)
        if self.lm_head is None:
            return self.embedding.as_linear(h)
        return linear(h, self.lm_head)
