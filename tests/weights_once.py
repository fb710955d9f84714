"""dequantize_linear once per layer, for the test processes only.

The tests build hand-written models of the same session-scoped mlx-lm weights
hundreds of times (the embedded model's 211 matrices each time: ~37 CPU-s of a
suite run went to dequantizing them and laying them out for the BLAS). A layer's
float weight is a function of its arrays and the dtype, so it is computed once per
(layer, dtype) and kept while the layer lives, and computed again if the layer's
arrays were replaced. The models only read their weights.
"""

import weakref

import tiny_llm_base
from tiny_llm_base import weights

computed = weights.dequantize_linear
kept: dict = {}


def dequantize_once(layer, dtype=None):
    """tiny_llm_base.dequantize_linear, kept per (layer, dtype)."""
    key = (id(layer), dtype)
    arrays = tuple(layer.get(name) for name in ("weight", "scales", "biases"))
    entry = kept.get(key)
    if entry is not None and all(a is b for a, b in zip(entry[0], arrays)):
        return entry[1]
    weight = computed(layer, dtype)
    if entry is None:
        weakref.finalize(layer, kept.pop, key, None)
    kept[key] = (arrays, weight)
    return weight


def install() -> None:
    """Every model built after this (the package under test imports the name from
    tiny_llm_base) gets its weights through dequantize_once."""
    tiny_llm_base.dequantize_linear = weights.dequantize_linear = dequantize_once
