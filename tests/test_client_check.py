"""The clients `pdm run client-check` drives that are dev dependencies (openai and
anthropic): each feature's usage, as the script runs it
(scripts/tools/clients/), against the reference engine served in this process.
The other clients install into virtualenvs of their own from PyPI, which the
suite does not do; run the script for them."""

import pytest
import tiny_llm_ref

from scripts.tools.clients import Server, anthropic_client, openai_client
from tiny_llm_serve import ServerSettings, create_app

from .servers import API_KEY, MAX_SEQ_LEN, REF_CONSTRAINTS, RunningServer

MODEL = "test-model"
FEATURES = [
    (module, name)
    for module in (openai_client, anthropic_client)
    for name in module.FEATURES
]


@pytest.fixture(scope="module")
def server(embedded_model):
    # A model of its own, never run on this thread: its weights are still lazy, and
    # the engine thread could not evaluate them unless the loop does it first.
    model = tiny_llm_ref.Qwen2ModelWeek2(embedded_model[0], use_fast_kernels=True)
    engine = tiny_llm_ref.Engine(
        model,
        embedded_model[1],
        batch_size=4,
        max_seq_len=MAX_SEQ_LEN,
        policy="mixed",
        kv_cache="paged",
    )
    settings = ServerSettings(MODEL, api_key=API_KEY)
    app = create_app(engine, settings, tiny_llm_ref.make_sampler, REF_CONSTRAINTS)
    running = RunningServer(app)
    yield Server(running.url, MODEL, API_KEY)
    running.stop()


@pytest.mark.parametrize(
    "module, name",
    FEATURES,
    ids=[f"{m.__name__.rsplit('.', 1)[-1]}: {n}" for m, n in FEATURES],
)
def test_the_client_usage_works(server, module, name):
    module.FEATURES[name](server)
