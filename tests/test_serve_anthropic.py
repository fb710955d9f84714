"""Anthropic's Messages API (POST /v1/messages), through the official anthropic
client's `messages.create` and `messages.stream`.

The client is the independent implementation of the wire format: it parses the
message, the stream's events and the error objects into its own types (and
raises its own exception types). The answers are compared with the chat route's
for the same conversation under greedy decoding (the same engine reached by
another path, here through plain HTTP); tool calls are checked by the jsonschema
package against their tool's input_schema.
"""

import json

import anthropic
import httpx
import jsonschema
import pytest

from .helpers import TLS
from .servers import (
    API_KEY,
    CHAT,
    MAX_SEQ_LEN,
    MODEL,
    WAIT_S,
    broken_server,
    chat_prompt,
    package_server,
)

QUESTION = "What is the capital of France?"
GREEDY = {"temperature": 0}  # the client has no temperature argument of its own
WEATHER_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}},
    "required": ["city"],
    "additionalProperties": False,
}
WEATHER = {
    "name": "get_weather",
    "description": "The current weather in a city.",
    "input_schema": WEATHER_SCHEMA,
}
# The same tool as the chat route takes it.
CHAT_WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": WEATHER_SCHEMA,
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def server(protocol_model):
    with package_server(protocol_model) as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    return server.anthropic_client()


@pytest.fixture(scope="module")
def http(server):
    headers = {"Authorization": f"Bearer {API_KEY}"}
    with httpx.Client(
        base_url=server.url, verify=TLS, headers=headers, timeout=WAIT_S
    ) as c:
        yield c


def chat(http, messages, max_tokens, **extra) -> dict:
    """The chat route's greedy answer to the same conversation."""
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0}
    response = http.post(CHAT, json={**body, **extra})
    assert response.status_code == 200, response.text
    return response.json()


def test_a_plain_answer_is_the_chat_routes(client, http):
    message = client.messages.create(
        model=MODEL,
        system="Answer in one short sentence.",
        messages=[{"role": "user", "content": QUESTION}],
        max_tokens=12,
        extra_body=GREEDY,
    )
    expected = chat(
        http,
        [
            {"role": "system", "content": "Answer in one short sentence."},
            {"role": "user", "content": QUESTION},
        ],
        12,
    )
    assert message.type == "message" and message.role == "assistant"
    assert message.id.startswith("msg_")
    [block] = message.content
    assert block.type == "text"
    assert block.text == expected["choices"][0]["message"]["content"]
    counts = expected["usage"]
    prompt = message.usage.input_tokens + message.usage.cache_read_input_tokens
    assert prompt == counts["prompt_tokens"]
    assert message.usage.output_tokens == counts["completion_tokens"]
    finished = expected["choices"][0]["finish_reason"]
    assert message.stop_reason == ("max_tokens" if finished == "length" else "end_turn")


def test_system_blocks_and_content_blocks_make_the_same_chat(client, http):
    message = client.messages.create(
        model=MODEL,
        system=[{"type": "text", "text": "Be brief."}],
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
            {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": QUESTION},
        ],
        max_tokens=8,
        extra_body=GREEDY,
    )
    expected = chat(
        http,
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": QUESTION},
        ],
        8,
    )
    assert message.content[0].text == expected["choices"][0]["message"]["content"]
    prompt = message.usage.input_tokens + message.usage.cache_read_input_tokens
    assert prompt == expected["usage"]["prompt_tokens"]


def test_count_tokens_is_the_prompt_the_answer_uses(client):
    asked = {"model": MODEL, "system": "Be brief.", "messages": ASK}
    counted = client.messages.count_tokens(**asked, tools=[WEATHER])
    message = client.messages.create(
        **asked, tools=[WEATHER], max_tokens=1, extra_body=GREEDY
    )
    prompt = message.usage.input_tokens + message.usage.cache_read_input_tokens
    assert counted.input_tokens == prompt
    assert client.messages.count_tokens(**asked).input_tokens < prompt  # no tools


def test_a_streamed_answer_is_the_whole_ones(client):
    asked = {
        "model": MODEL,
        "messages": [{"role": "user", "content": QUESTION}],
        "max_tokens": 10,
        "extra_body": GREEDY,
    }
    whole = client.messages.create(**asked)
    with client.messages.stream(**asked) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    # The client yields a "text" event after each text_delta, and skips pings.
    assert kinds[:2] == ["message_start", "content_block_start"]
    assert set(kinds[2:-3]) == {"content_block_delta", "text"}
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert final.content[0].text == whole.content[0].text
    assert final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens
    prompt = final.usage.input_tokens + final.usage.cache_read_input_tokens
    assert prompt == whole.usage.input_tokens + whole.usage.cache_read_input_tokens


def test_a_stop_sequence_ends_the_answer_and_is_named(client, http):
    unstopped = chat(http, [{"role": "user", "content": QUESTION}], 16)
    text = unstopped["choices"][0]["message"]["content"]
    stop = text.split()[2]  # a word the greedy answer surely writes
    for stream in (False, True):
        asked = {
            "model": MODEL,
            "messages": [{"role": "user", "content": QUESTION}],
            "max_tokens": 16,
            "stop_sequences": ["#never#", stop],
            "extra_body": GREEDY,
        }
        if stream:
            with client.messages.stream(**asked) as events:
                message = events.get_final_message()
        else:
            message = client.messages.create(**asked)
        assert message.stop_reason == "stop_sequence", message
        assert message.stop_sequence == stop
        assert message.content[0].text == text[: text.index(stop)]


def test_a_tool_use_and_its_result_round_trip(client, http):
    first = client.messages.create(
        model=MODEL,
        messages=ASK,
        tools=[WEATHER],
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
        max_tokens=64,
        extra_body=GREEDY,
    )
    assert first.stop_reason == "tool_use"
    [call] = first.content
    assert call.type == "tool_use" and call.name == "get_weather"
    assert call.id.startswith("toolu_")
    jsonschema.validate(call.input, WEATHER_SCHEMA)
    result = {"type": "tool_result", "tool_use_id": call.id, "content": "21 C"}
    second = client.messages.create(
        model=MODEL,
        messages=ASK
        + [
            {"role": "assistant", "content": first.content},
            {"role": "user", "content": [result]},
        ],
        tools=[WEATHER],
        max_tokens=12,
        extra_body=GREEDY,
    )
    chat_call = {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": json.dumps(call.input)},
    }
    history = ASK + [
        {"role": "assistant", "tool_calls": [chat_call]},
        {"role": "tool", "tool_call_id": call.id, "content": "21 C"},
    ]
    expected = chat(http, history, 12, tools=[CHAT_WEATHER])
    prompt = second.usage.input_tokens + second.usage.cache_read_input_tokens
    assert prompt == expected["usage"]["prompt_tokens"]
    answer = expected["choices"][0]["message"]
    texts = [block.text for block in second.content if block.type == "text"]
    assert "".join(texts) == (answer["content"] or "")
    uses = [block for block in second.content if block.type == "tool_use"]
    assert len(uses) == len(answer.get("tool_calls") or [])


def test_a_streamed_tool_use_arrives_as_input_json(client):
    with client.messages.stream(
        model=MODEL,
        messages=ASK,
        tools=[WEATHER],
        tool_choice={
            "type": "tool",
            "name": "get_weather",
            "disable_parallel_tool_use": True,
        },
        max_tokens=64,
        extra_body=GREEDY,
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert "input_json" in kinds and "text" not in kinds
    [call] = final.content
    assert call.type == "tool_use" and call.name == "get_weather"
    jsonschema.validate(call.input, WEATHER_SCHEMA)
    assert final.stop_reason == "tool_use"


def test_max_tokens_past_the_context_ends_where_the_context_does(
    client, http, tokenizer
):
    for count in range(60, 0, -1):  # notes that leave the answer a little room
        notes = " ".join(f"Note {i}: the sky is blue." for i in range(count))
        room = MAX_SEQ_LEN - len(chat_prompt(tokenizer, notes))
        if room >= 8:
            break
    assert room < 24, room  # a short answer fills the context
    message = client.messages.create(
        model=MODEL,
        messages=[{"role": "user", "content": notes}],
        max_tokens=100_000,  # Anthropic's clients send large ones
        extra_body=GREEDY,
    )
    expected = chat(http, [{"role": "user", "content": notes}], room)
    assert expected["choices"][0]["finish_reason"] == "length"  # it fills the room
    assert message.content[0].text == expected["choices"][0]["message"]["content"]
    assert message.stop_reason == "model_context_window_exceeded"
    assert message.usage.output_tokens == room


def test_the_api_key_comes_as_x_api_key(server):
    wrong = server.anthropic_client(api_key="wrong")
    with pytest.raises(anthropic.AuthenticationError) as caught:
        wrong.messages.create(model=MODEL, messages=ASK, max_tokens=1)
    assert caught.value.body["error"]["type"] == "authentication_error"


BAD = [
    ({"max_tokens": None}, "max_tokens is required"),
    ({"max_tokens": 0}, "max_tokens must be at least 1"),
    ({"messages": []}, "messages is empty"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role"),
    (
        {"messages": [{"role": "user", "content": [{"type": "image"}]}]},
        "'image' blocks",
    ),
    ({"temperature": 1.5}, "temperature must be in [0, 1]"),
    ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking:"),
    (
        {"tools": [{"type": "web_search_20250305", "name": "web_search"}]},
        "server tool",
    ),
    (
        {"tools": [WEATHER], "tool_choice": {"type": "tool", "name": "x"}},
        "not in tools",
    ),
    (
        {"tools": [{**WEATHER, "input_schema": {"type": "object", "not": {}}}]},
        "tools[0].input_schema",
    ),
    ({"stop_sequences": "x"}, "stop_sequences must be a list"),
]


@pytest.mark.parametrize("change, message", BAD)
def test_a_bad_body_is_a_400_in_anthropics_shape(client, change, message):
    body = {"model": MODEL, "messages": ASK, "max_tokens": 4}
    body.update(change)
    body = {k: v for k, v in body.items() if v is not None}
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.post("/v1/messages", body=body, cast_to=object)
    assert caught.value.status_code == 400
    error = caught.value.body
    assert error["type"] == "error", error
    assert error["error"]["type"] == "invalid_request_error", error
    assert message in error["error"]["message"], error


def test_an_engine_that_raises_fails_in_anthropics_shape(embedded_model):
    vocab_size = embedded_model[0].args.vocab_size
    with broken_server(embedded_model[1], vocab_size) as running:
        broken = running.anthropic_client(api_key="none")
        with pytest.raises(anthropic.APIStatusError) as caught:  # mid-stream
            with broken.messages.stream(model=MODEL, messages=ASK, max_tokens=2) as s:
                list(s)
        assert caught.value.body["error"]["type"] == "api_error"
        assert "Week 2 Day 6" in caught.value.body["error"]["message"]
        with pytest.raises(anthropic.InternalServerError) as caught:  # then 503
            broken.messages.create(model=MODEL, messages=ASK, max_tokens=2)
        assert caught.value.status_code == 503
        assert "restart" in caught.value.body["error"]["message"]


def test_an_unknown_model_is_a_404_in_anthropics_shape(client):
    with pytest.raises(anthropic.NotFoundError) as caught:
        client.messages.create(model="claude-x", messages=ASK, max_tokens=1)
    assert caught.value.body["error"]["type"] == "not_found_error"
    assert MODEL in caught.value.body["error"]["message"]
