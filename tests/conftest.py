from .solution import tiny  # noqa: F401, I001  (first: the fast BLAS must load before mlx)

import mlx.core as mx
import pytest


@pytest.fixture(scope="session")
def embedded_model():
    """(mlx_model, tokenizer) of the embedded SmolLM2 model, loaded once per run."""
    from tiny_llm_base import load_model

    return load_model()


@pytest.fixture(autouse=True)
def seeded():
    mx.random.seed(0)


@pytest.fixture(scope="session")
def embedded_float32_reference():
    """mlx-lm's own model with the embedded weights dequantized to float32, once per run.

    The same weights our float32 models use, so greedy outputs can be compared token
    for token; set_dtype comes first so the scales dequantize in float32, not float16.
    """
    from mlx_lm.utils import dequantize_model

    from tiny_llm_base import load_model

    model, _ = load_model()  # a fresh copy: dequantize_model changes it in place
    model.set_dtype(mx.float32)
    dequantize_model(model)
    mx.eval(model.parameters())
    return model
