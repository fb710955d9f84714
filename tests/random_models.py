"""mlx-lm Qwen2 and Llama models with random weights at unusual sizes: the independent
references the hand-written model is compared against."""

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_map
from mlx_lm.models import llama, qwen2

# (architecture, hidden, heads, kv_heads, intermediate, layers, vocab, tied)
SIZES = [
    ("qwen2", 96, 6, 2, 160, 2, 211, False),
    ("qwen2", 128, 4, 4, 96, 3, 157, True),
    ("llama", 72, 3, 1, 120, 2, 173, True),
    ("llama", 160, 10, 5, 64, 2, 199, False),
]


def random_model(
    arch: str = "qwen2",
    hidden: int = 96,
    heads: int = 6,
    kv_heads: int = 2,
    intermediate: int = 160,
    layers: int = 2,
    vocab: int = 211,
    tied: bool = False,
    dtype: mx.Dtype = mx.float32,
    seed: int = 0,
) -> nn.Module:
    """An mlx-lm model whose weights are drawn at scale 0.1 (biases on for qwen2)."""
    common = dict(
        model_type=arch,
        hidden_size=hidden,
        num_hidden_layers=layers,
        intermediate_size=intermediate,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        rms_norm_eps=1e-6,
        vocab_size=vocab,
        tie_word_embeddings=tied,
        rope_theta=10000.0 + 37 * seed,
    )
    if arch == "qwen2":
        model = qwen2.Model(qwen2.ModelArgs(**common, max_position_embeddings=4096))
    else:
        model = llama.Model(llama.ModelArgs(**common))
    mx.random.seed(seed)
    model.update(
        tree_map(
            lambda p: (0.1 * mx.random.normal(p.shape)).astype(dtype),
            model.parameters(),
        )
    )
    mx.eval(model.parameters())
    return model


def random_models(dtype: mx.Dtype = mx.float32):
    return [random_model(*size, dtype=dtype, seed=i) for i, size in enumerate(SIZES)]
