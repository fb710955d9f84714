"""mlx-lm's float32 embedded model, one batch-1 decode step after a short prompt:
its logits [vocab]. test_setup compares them with the few-row forwarder on (in its
own process) and off: `python -m tests.decode_step OUT.npy` saves them, in a process
that must not have the forwarder (TINY_LLM_GEMV_FORWARD=0)."""

import sys

import numpy as np

from tiny_llm_base import fast_blas  # first: loads the fast BLAS before mlx.core

import mlx.core as mx  # noqa: E402
from mlx_lm.models.cache import make_prompt_cache  # noqa: E402

from tiny_llm_base.loader import load_model  # noqa: E402
from tiny_llm_base.mlx_lm_reference import float32_copy  # noqa: E402


def decode_step_logits() -> np.ndarray:
    model, tokenizer = load_model(None)
    model = float32_copy(model)
    cache = make_prompt_cache(model)
    model(mx.array([tokenizer.encode("The capital of France is")]), cache=cache)
    return np.array(model(mx.array([[264]]), cache=cache)[0, -1])


if __name__ == "__main__":
    assert fast_blas.STATUS.gemv_forward is None, fast_blas.STATUS
    np.save(sys.argv[1], decode_step_logits())
