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
        raise NotImplementedError(
            "Week 1 Day 4 Task 2: Qwen2MLP.__init__ (keep the weights)"
        )

    def __call__(self, x: mx.array) -> mx.array:
        """x: [..., dim] -> [..., dim]."""
        raise NotImplementedError(
            "Week 1 Day 4 Task 2: Qwen2MLP (down(silu(gate x) * up x))"
        )


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
        raise NotImplementedError(
            "Week 1 Day 5 Task 2: Qwen2MultiHeadAttention.__init__"
        )

    def __call__(self, x: mx.array) -> mx.array:
        """x: [B, L, E] -> [B, L, E]; position p attends to positions 0 .. p."""
        raise NotImplementedError("Week 1 Day 5 Task 2: Qwen2MultiHeadAttention")


class Qwen2TransformerBlock:
    """Pre-norm residual block: h = x + attention(norm(x)); out = h + mlp(norm(h))."""

    def __init__(
        self,
        attention: Qwen2MultiHeadAttention,
        mlp: Qwen2MLP,
        input_norm: RMSNorm,
        post_attention_norm: RMSNorm,
    ):
        raise NotImplementedError("Week 1 Day 5 Task 2: Qwen2TransformerBlock.__init__")

    def __call__(self, x: mx.array) -> mx.array:
        """x: [B, L, E] -> [B, L, E]."""
        raise NotImplementedError(
            "Week 1 Day 5 Task 2: Qwen2TransformerBlock (two residual branches)"
        )


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
        raise NotImplementedError(
            "Week 1 Day 5 Task 3: Qwen2ModelWeek1.__init__ (copy the weights)"
        )

    def _weight(self, layer: nn.Module) -> mx.array:
        raise NotImplementedError(
            "Week 1 Day 5 Task 3: _weight: the layer's weight as a float array of "
            "self.dtype (dequantize_linear), evaluated now"
        )

    def _bias(self, layer: nn.Module) -> mx.array | None:
        raise NotImplementedError(
            "Week 1 Day 5 Task 3: _bias: the layer's bias in self.dtype, or None when"
            " it has none"
        )

    def _block(self, layer: nn.Module, args, rope: RoPE) -> Qwen2TransformerBlock:
        raise NotImplementedError(
            "Week 1 Day 5 Task 3: _block: one Qwen2TransformerBlock from an mlx-lm "
            "layer (attention with its biases, MLP, the two norms)"
        )

    def __call__(self, inputs: mx.array) -> mx.array:
        """inputs: [B, L] token ids -> logits [B, L, vocab_size], causal, no cache."""
        raise NotImplementedError(
            "Week 1 Day 5 Task 3: Qwen2ModelWeek1 (embed, blocks, norm, head)"
        )
