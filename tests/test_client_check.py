"""The clients `pdm run client-check` drives that are dev dependencies (openai and
anthropic): each feature's usage, as the script runs it
(scripts/tools/clients/), against the package's engine (tests/solution.py) served
in this process.
The features run side by side, as many users' clients would: the engine batches
their steps (each feature is greedy and checks only what its client promises, so
batching changes nothing it asserts), and each test reports its own feature.
The other clients install into virtualenvs of their own from PyPI, which the
suite does not do; run the script for them."""

from concurrent.futures import ThreadPoolExecutor

import pytest

from scripts.tools.clients import ServerAddress, anthropic_client, openai_client

from .servers import API_KEY, MODEL, package_server

FEATURES = [
    (module, name)
    for module in (openai_client, anthropic_client)
    for name in module.FEATURES
]


# The features whose answers need a model that ends its strings (a schema's string
# value, a tool's string argument): they run on the embedded model, the others on a
# random one (their checks are the protocol's, and its forwards cost a hundredth).
NEEDS_WORDS = {
    (openai_client, "chat.completions.parse"),
    (anthropic_client, "tool_use / tool_result round trip"),
}


@pytest.fixture(scope="module")
def outcomes(protocol_model, embedded_model) -> dict:
    """(module, feature name) -> the future of that feature's run; all started at
    once against two servers."""
    with (
        package_server(protocol_model) as protocol,
        package_server(embedded_model) as worded,
    ):

        def address(feature) -> ServerAddress:
            running = worded if feature in NEEDS_WORDS else protocol
            return ServerAddress(running.url, MODEL, API_KEY)

        with ThreadPoolExecutor(len(FEATURES)) as pool:
            futures = {
                (module, name): pool.submit(
                    module.FEATURES[name], address((module, name))
                )
                for module, name in FEATURES
            }
            for future in futures.values():
                future.exception()  # every run ends before the server stops
        yield futures


@pytest.mark.parametrize(
    "module, name",
    FEATURES,
    ids=[f"{m.__name__.rsplit('.', 1)[-1]}: {n}" for m, n in FEATURES],
)
def test_the_client_usage_works(outcomes, module, name):
    outcomes[module, name].result()  # the feature's own error, if it raised
