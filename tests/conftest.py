import mlx.core as mx
import pytest

from .solution import tiny  # noqa: F401  (imports tiny_llm first: fast BLAS before mlx)


@pytest.fixture(scope="session")
def embedded_model():
    """(mlx_model, tokenizer) of the embedded SmolLM2 model, loaded once per run."""
    from tiny_llm_ref import load_model

    return load_model()


@pytest.fixture(autouse=True)
def seeded():
    mx.random.seed(0)
