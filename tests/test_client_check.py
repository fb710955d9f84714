"""The clients `pdm run client-check` drives that are dev dependencies (openai and
anthropic): each feature's usage, as the script runs it
(scripts/tools/clients/), against the package's engine (tests/solution.py) served
in this process.
The other clients install into virtualenvs of their own from PyPI, which the
suite does not do; run the script for them."""

import pytest

from scripts.tools.clients import Server, anthropic_client, openai_client

from .servers import API_KEY, MODEL, package_server

FEATURES = [
    (module, name)
    for module in (openai_client, anthropic_client)
    for name in module.FEATURES
]


@pytest.fixture(scope="module")
def server(embedded_model):
    with package_server(embedded_model) as running:
        yield Server(running.url, MODEL, API_KEY)


@pytest.mark.parametrize(
    "module, name",
    FEATURES,
    ids=[f"{m.__name__.rsplit('.', 1)[-1]}: {n}" for m, n in FEATURES],
)
def test_the_client_usage_works(server, module, name):
    module.FEATURES[name](server)
