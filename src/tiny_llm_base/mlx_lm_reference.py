"""mlx-lm as the reference the tests and benchmarks compare against.

Everything here uses mlx-lm and MLX only, never the course's code, so that comparing
our models with these gives an independent check: mlx-lm's own model holding our
float32 weights, chat prompts as token ids, and mlx-lm's greedy generation of one
prompt alone.
"""

from collections.abc import Callable, Iterable

import mlx.core as mx
import numpy as np
from mlx import nn
from mlx.utils import tree_flatten
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import KVCache, QuantizedKVCache

from .memory import KV_BITS, KV_GROUP_SIZE


def float32_copy(mlx_model: nn.Module) -> nn.Module:
    """A new mlx-lm model of the same class, every weight in float32.

    Each quantized layer is dequantized with float32 scales and biases: dequantizing
    in the scales' own float16 would round every weight before it reaches float32.
    These are the weights Qwen2ModelWeek2(weights="float32") computes with, so greedy
    outputs can be compared token for token. mlx_model itself is left as it is.
    """
    params = dict(tree_flatten(mlx_model.parameters()))
    for name, module in mlx_model.named_modules():
        if "scales" not in module:
            continue
        params[f"{name}.weight"] = mx.dequantize(
            module["weight"],
            module["scales"].astype(mx.float32),
            module["biases"].astype(mx.float32),
            group_size=module.group_size,
            bits=module.bits,
        )
        del params[f"{name}.scales"]
        del params[f"{name}.biases"]
    copy = type(mlx_model)(mlx_model.args)
    copy.load_weights([(k, v.astype(mx.float32)) for k, v in params.items()])
    mx.eval(copy.parameters())
    return copy


def chat_ids(tokenizer, question: str) -> list[int]:
    """The token ids of `question` as one user turn, ready for the answer."""
    return list(
        tokenizer.apply_chat_template(
            [{"role": "user", "content": question}], add_generation_prompt=True
        )
    )


def banned_mask(vocab: int, banned: Iterable[int]) -> mx.array:
    """[vocab]: -inf at the banned token ids, 0 elsewhere; add it to logits."""
    mask = np.zeros(vocab, dtype=np.float32)
    mask[list(banned)] = -np.inf
    return mx.array(mask)


def greedy_without(banned: Iterable[int], vocab: int) -> Callable[[mx.array], mx.array]:
    """A greedy sampler over [B, vocab] logits that never picks a banned token
    (EOS, say, so that every request runs to max_tokens)."""
    mask = banned_mask(vocab, banned)
    return lambda logprobs: mx.argmax(logprobs + mask, axis=-1)


class Float16KVCache(KVCache):
    """mlx-lm's KVCache holding keys and values in float16, read back in the dtype
    they came in."""

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        stored = super().update_and_fetch(
            keys.astype(mx.float16), values.astype(mx.float16)
        )
        return stored[0].astype(keys.dtype), stored[1].astype(values.dtype)


def mlx_lm_greedy(
    mlx_model: nn.Module,
    prompt: list[int],
    max_tokens: int,
    eos_ids: Iterable[int],
    banned: Iterable[int] = (),
    kv_dtype: str = "float32",
) -> tuple[list[int], list[float]]:
    """mlx-lm's greedy generation of one prompt alone: (tokens, top-2 logit gaps).

    Stops before an EOS token, as a request does; `banned` tokens are never picked.
    gaps[i] is how far mlx-lm's best logit at token i is above the second best: where
    it is tiny, float32 rounding may pick either token. kv_dtype: keys and values
    kept as the engine's kv_dtype keeps them, from the first token on, the prompt's
    included: "float16" in a KVCache that stores them in float16, "int8" / "int4"
    in mlx-lm's own QuantizedKVCache (mx.quantize, KV_GROUP_SIZE numbers a group).
    """
    eos_ids = set(eos_ids)
    mask = banned_mask(mlx_model.args.vocab_size, banned)
    cache = None
    if kv_dtype == "float16":
        cache = [Float16KVCache() for _ in mlx_model.layers]
    elif kv_dtype != "float32":
        bits = KV_BITS[kv_dtype]
        cache = [
            QuantizedKVCache(group_size=KV_GROUP_SIZE, bits=bits)
            for _ in mlx_model.layers
        ]
    tokens, gaps = [], []
    for token, logprobs in generate_step(
        mx.array(prompt),
        mlx_model,
        max_tokens=max_tokens,
        sampler=lambda lp: mx.argmax(lp + mask, axis=-1),
        prompt_cache=cache,
    ):
        top_two = mx.sort(logprobs + mask)[-2:]
        gaps.append((top_two[1] - top_two[0]).item())
        if token in eos_ids:
            break
        tokens.append(token)
    return tokens, gaps
