"""Answers that continue the client's own text: /v1/completions with `echo`.

The echoed prompt and the answer must read as the tokenizer decodes them
together: the engine's streaming detokenizer drops the space an answer starts
with, which belongs between "The sky is" and " blue". The answers are compared
with mlx-lm's greedy tokens for the same prompt (its own model on the same
float32 weights, tiny_llm_base.mlx_lm_reference), decoded by the tokenizer; the
requests go through the official openai client.
"""

import pytest

from tiny_llm_base.mlx_lm_reference import mlx_lm_greedy

from .helpers import NEAR_TIE
from .servers import MODEL, package_server

TOKENS = 8


@pytest.fixture(scope="module")
def server(embedded_model):
    with package_server(embedded_model) as running:
        yield running


@pytest.fixture(scope="module")
def openai_client(server):
    return server.openai_client()


def greedy_continuation(reference, tokenizer, ids: list[int]) -> str:
    """The text mlx-lm's greedy tokens add to `ids`, as the tokenizer decodes the
    prompt and the answer together. It must start with a space (the case at hand)
    and have no near tie that float rounding could tip."""
    tokens, gaps = mlx_lm_greedy(reference, ids, TOKENS, tokenizer.eos_token_ids)
    assert min(gaps) > NEAR_TIE, f"a near tie in {gaps}: choose another prompt"
    prompt = tokenizer.decode(ids)
    whole = tokenizer.decode(ids + tokens)
    assert whole.startswith(prompt), (prompt, whole)
    continuation = whole[len(prompt) :]
    assert continuation.startswith(" "), continuation
    return continuation


def test_an_echoed_prompt_and_its_completion_read_as_decoded_together(
    openai_client, tokenizer, embedded_float32_reference
):
    prompt = "The sky is"
    ids = tokenizer.encode(prompt)
    assert tokenizer.decode(ids) == prompt
    expected = prompt + greedy_continuation(embedded_float32_reference, tokenizer, ids)
    options = dict(model=MODEL, prompt=prompt, max_tokens=TOKENS, temperature=0)
    whole = openai_client.completions.create(echo=True, logprobs=0, **options)
    choice = whole.choices[0]
    assert choice.text == expected
    # Each token's text starts where text_offset says, in the same text.
    offsets, tokens = choice.logprobs.text_offset, choice.logprobs.tokens
    assert "".join(tokens) == choice.text
    assert all(choice.text[o:].startswith(t) for o, t in zip(offsets, tokens))
    chunks = openai_client.completions.create(echo=True, stream=True, **options)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == expected
