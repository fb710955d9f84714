"""The clients `pdm run client-check` drives: one module per client, each a dict
FEATURES of feature name -> function(server) that runs the client's first
documented usage of that feature against `server` (a ServerAddress) and raises when it
does not work. check.py runs a module's features in that client's own virtualenv
(requirements/<module>.txt); openai and anthropic run in the project's, where
they are dev dependencies (the test suite runs their features too)."""

from dataclasses import dataclass


@dataclass(frozen=True)
class ServerAddress:
    """Where the server listens: `url` is http://host:port (no /v1)."""

    url: str
    model: str
    api_key: str

    @property
    def v1(self) -> str:
        return self.url + "/v1"


class ModelAnswer(Exception):
    """The server kept its promise; the client refused what the model wrote."""


def cut_short(text: str | None, max_tokens: int) -> ModelAnswer:
    """What to raise when the answer ended at max_tokens inside a constrained
    value (the server's promise: a match, or finish_reason "length"): the model
    kept writing, often one phrase again and again."""
    shown = (text or "").replace("\n", " ")
    shown = shown if len(shown) <= 70 else shown[:67] + "..."
    return ModelAnswer(f"cut at max_tokens={max_tokens} while still inside: {shown}")
