"""Answers that continue the client's own text: /v1/completions with `echo`, and an
Anthropic Messages request whose last message is the assistant's (a prefill).

Both must read as the tokenizer decodes the prompt and the answer together: the
engine's streaming detokenizer drops the space an answer starts with, which
belongs between "The sky is" and " blue". A prefill is continued: the prompt the
engine sees ends with the prefill's text, inside the assistant's turn, and the
answer is the continuation alone. The answers are compared with mlx-lm's greedy
tokens for the prompt built by hand (its own model on the same float32 weights,
tiny_llm_base.mlx_lm_reference), decoded by the tokenizer; the requests go
through the official openai and anthropic clients.
"""

import anthropic
import pytest

from tiny_llm_base.mlx_lm_reference import mlx_lm_greedy

from .helpers import NEAR_TIE
from .servers import MODEL, package_server

TOKENS = 8
QUESTION = "What is the capital of France?"
PREFILL = "The capital of France is"
GREEDY = {"temperature": 0}  # the anthropic client has no temperature of its own


@pytest.fixture(scope="module")
def server(embedded_model):
    with package_server(embedded_model) as running:
        yield running


@pytest.fixture(scope="module")
def openai_client(server):
    return server.openai_client()


@pytest.fixture(scope="module")
def anthropic_client(server):
    return server.anthropic_client()


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


def test_an_assistant_prefill_is_continued(
    anthropic_client, tokenizer, embedded_float32_reference
):
    """The prompt is the chat up to the assistant's turn, then the prefill's text:
    no end of turn after it, no second assistant turn."""
    opened = tokenizer.apply_chat_template(
        [{"role": "user", "content": QUESTION}],
        add_generation_prompt=True,
        tokenize=False,
    )
    ids = tokenizer.encode(opened + PREFILL, add_special_tokens=False)
    expected = greedy_continuation(embedded_float32_reference, tokenizer, ids)
    messages = [
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": PREFILL},
    ]
    reply = anthropic_client.messages.create(
        model=MODEL, max_tokens=TOKENS, messages=messages, extra_body=GREEDY
    )
    assert reply.usage.input_tokens == len(ids)
    assert [block.type for block in reply.content] == ["text"]
    assert reply.content[0].text == expected
    with anthropic_client.messages.stream(
        model=MODEL, max_tokens=TOKENS, messages=messages, extra_body=GREEDY
    ) as stream:
        assert "".join(stream.text_stream) == expected
    counted = anthropic_client.messages.count_tokens(model=MODEL, messages=messages)
    assert counted.input_tokens == len(ids)


USE = {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}
BAD_PREFILLS = [
    (
        "ending in whitespace",
        {"messages": [{"role": "assistant", "content": "Paris is "}]},
        "messages[1].content ends with whitespace",
    ),
    (
        "a tool call",
        {
            "messages": [{"role": "assistant", "content": [USE]}],
            "tools": [{"name": "f", "input_schema": {"type": "object"}}],
        },
        "messages[1] is the assistant's tool_use",
    ),
    (
        "under an output schema",
        {
            "messages": [{"role": "assistant", "content": "{"}],
            "extra_body": {
                "output_config": {
                    "format": {"type": "json_schema", "schema": {"type": "object"}}
                }
            },
        },
        "messages[1] is an assistant prefill, but output_config.format",
    ),
]


@pytest.mark.parametrize(
    "options, words",
    [case[1:] for case in BAD_PREFILLS],
    ids=[case[0] for case in BAD_PREFILLS],
)
def test_a_prefill_no_answer_can_continue_is_refused(anthropic_client, options, words):
    options = dict(options)
    messages = [{"role": "user", "content": QUESTION}] + options.pop("messages")
    with pytest.raises(anthropic.BadRequestError) as caught:
        anthropic_client.messages.create(
            model=MODEL, max_tokens=TOKENS, messages=messages, **options
        )
    message = caught.value.body["error"]["message"]
    assert message.startswith(words), message
