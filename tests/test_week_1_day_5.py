"""Week 1 Day 5: Embedding and the whole hand-written model.

References: mlx.nn.Embedding, and mlx-lm's own qwen2/llama models holding the same
weights: random ones at unusual sizes (tests/random_models.py) and the embedded,
quantized SmolLM2.
"""

import functools
import mlx.core as mx
import numpy as np
import pytest
from mlx import nn

from .random_models import random_model, random_models
from . import helpers
from .solution import tiny

TOLERANCE = {mx.float32: 1e-5, mx.float16: 3e-3, mx.bfloat16: 2e-2}
DTYPES = [mx.float32, mx.float16, mx.bfloat16]
assert_close = functools.partial(helpers.assert_close, tolerance=TOLERANCE)


@pytest.mark.task(1)
@pytest.mark.parametrize("dtype", DTYPES)
def test_embedding(dtype):
    vocab, dim = 101, 24
    reference = nn.Embedding(vocab, dim)
    reference.set_dtype(dtype)
    embedding = tiny.Embedding(vocab, dim, reference.weight)
    ids = mx.array([[0, 5, 100, 5], [17, 3, 99, 42]])
    assert_close(embedding(ids), reference(ids), dtype)
    x = mx.random.normal((2, 3, dim)).astype(dtype)
    assert_close(embedding.as_linear(x), reference.as_linear(x), dtype)


def layer_parts(reference, index: int = 0):
    """The attention and the block of layer `index` of an mlx-lm model, built by
    hand from its weights: (our attention, our block, mlx-lm's layer)."""
    args, layer = reference.args, reference.model.layers[index]
    attn, mlp = layer.self_attn, layer.mlp
    head_dim = args.hidden_size // args.num_attention_heads
    rope = tiny.RoPE(
        head_dim,
        args.max_position_embeddings or 4096,
        base=args.rope_theta,
        traditional=args.rope_traditional,
    )

    def bias(linear):
        return linear["bias"] if "bias" in linear else None

    attention = tiny.qwen2_week1.Qwen2MultiHeadAttention(
        args.num_attention_heads,
        args.num_key_value_heads,
        attn.q_proj.weight,
        attn.k_proj.weight,
        attn.v_proj.weight,
        attn.o_proj.weight,
        rope=rope,
        bq=bias(attn.q_proj),
        bk=bias(attn.k_proj),
        bv=bias(attn.v_proj),
        bo=bias(attn.o_proj),
    )
    eps = args.rms_norm_eps
    block = tiny.qwen2_week1.Qwen2TransformerBlock(
        attention,
        tiny.Qwen2MLP(
            args.hidden_size,
            args.intermediate_size,
            mlp.gate_proj.weight,
            mlp.up_proj.weight,
            mlp.down_proj.weight,
        ),
        tiny.RMSNorm(args.hidden_size, layer.input_layernorm.weight, eps=eps),
        tiny.RMSNorm(args.hidden_size, layer.post_attention_layernorm.weight, eps=eps),
    )
    return attention, block, layer


@pytest.mark.task(2)
@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_attention_and_block_match_an_mlx_lm_layer(arch):
    """One layer, built by hand from an mlx-lm layer's weights (qwen2 with biases,
    llama without), against that layer with mlx-lm's causal mask."""
    reference = random_model(arch, 96, 6, 2, 160, 1, 211, seed=3)
    attention, block, layer = layer_parts(reference)
    x = mx.random.normal((2, 7, 96))
    assert_close(attention(x), layer.self_attn(x, mask="causal"), mx.float32)
    assert_close(block(x), layer(x, mask="causal"), mx.float32)


@pytest.mark.task(3)
@pytest.mark.parametrize("dtype", DTYPES)
def test_model_matches_mlx_lm_on_random_models(dtype):
    for reference in random_models(dtype):
        model = tiny.Qwen2ModelWeek1(reference)
        inputs = mx.random.randint(0, reference.args.vocab_size, (2, 13))
        assert_close(model(inputs), reference(inputs), dtype)


@pytest.mark.task(3)
def test_model_single_token_and_batch_rows_are_independent():
    reference = random_model("qwen2", 64, 4, 2, 48, 2, 97, tied=False, seed=5)
    model = tiny.Qwen2ModelWeek1(reference)
    inputs = mx.random.randint(0, 97, (3, 6))
    assert_close(model(inputs[:, :1]), reference(inputs[:, :1]), mx.float32)
    batched = model(inputs)
    for row in range(3):
        assert_close(batched[row : row + 1], model(inputs[row : row + 1]), mx.float32)


@pytest.mark.task(3)
def test_model_is_causal():
    """Logits at position p must not change when later tokens change."""
    model = tiny.Qwen2ModelWeek1(
        random_model("llama", 72, 3, 1, 120, 2, 173, tied=True)
    )
    first = mx.array([[3, 14, 15, 92, 65, 35]])
    second = mx.array([[3, 14, 15, 9, 26, 5]])
    np.testing.assert_allclose(
        np.array(model(first)[:, :3]), np.array(model(second)[:, :3]), atol=1e-6
    )


# The embedded model: mlx-lm multiplies by its 4-bit weights directly (and embeds in
# float16), the hand-written model by weights dequantized once to float32. Same
# numbers, rounded differently; the logits span about +-40.
EMBEDDED_LOGIT_ATOL = 0.1


@pytest.fixture(scope="module")
def embedded_logits(embedded_model):
    mlx_model, tokenizer = embedded_model
    ids = tokenizer.encode(
        "The capital of France is Paris, and the capital of Italy is"
    )
    inputs = mx.array(ids)[None]
    model = tiny.Qwen2ModelWeek1(mlx_model)
    return np.array(model(inputs)[0]), np.array(mlx_model(inputs)[0]), model


@pytest.mark.task(3)
def test_embedded_model_keeps_float32(embedded_logits):
    _, _, model = embedded_logits
    logits = model(mx.array([[1, 2, 3]]))
    assert logits.dtype == mx.float32
    assert logits.shape == (1, 3, 49152)


@pytest.mark.task(3)
def test_embedded_model_logits(embedded_logits):
    ours, reference, _ = embedded_logits
    assert ours.shape == reference.shape
    np.testing.assert_allclose(ours, reference, atol=EMBEDDED_LOGIT_ATOL, rtol=0)


@pytest.mark.task(3)
def test_embedded_model_greedy_tokens(embedded_logits):
    ours, reference, _ = embedded_logits
    top_two = np.sort(reference, axis=-1)[:, -2:]
    clear = top_two[:, 1] - top_two[:, 0] > 2 * EMBEDDED_LOGIT_ATOL
    # Where the reference's best token wins clearly, the greedy choices must agree;
    # near-ties may go either way.
    assert clear.sum() >= 8
    np.testing.assert_array_equal(
        ours.argmax(axis=-1)[clear], reference.argmax(axis=-1)[clear]
    )
