from .solution import tiny  # noqa: F401, I001  (first: the fast BLAS must load before mlx)

import mlx.core as mx
import pytest


@pytest.fixture(scope="session")
def embedded_model():
    """(mlx_model, tokenizer) of the embedded SmolLM2 model, loaded once per run."""
    from tiny_llm_ref import load_model

    return load_model()


@pytest.fixture(autouse=True)
def seeded():
    mx.random.seed(0)
