"""What a client may not send, on every API that takes it: a tool result that
answers no call the conversation made (OpenAI's and Anthropic's APIs refuse one),
and llguidance's own options (`x-guidance`) inside a JSON schema, which would let
a client switch off the server's schema checks (`"lenient": true` lets an
unsupported `uniqueItems` through, and `[1, 1]` comes back).

Each is refused with a 400 naming the place, before the engine sees it; the same
conversation with the result's id right is answered (two tokens on the package's
engine, tests/servers.py). The conversations go through the official openai and
anthropic clients, which shape them as their users send them.
"""

import anthropic
import httpx
import openai
import pytest

from .helpers import TLS, WAIT_S
from .servers import API_KEY, MODEL, package_server

ASK = {"role": "user", "content": "What is the weather in Paris?"}
ARGUMENTS = '{"city": "Paris"}'
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
}


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


def chat_call(call_id: str) -> dict:
    """An assistant message with one call, as the chat API takes it back."""
    function = {"name": "get_weather", "arguments": ARGUMENTS}
    call = {"id": call_id, "type": "function", "function": function}
    return {"role": "assistant", "content": None, "tool_calls": [call]}


def chat_result(call_id: str) -> dict:
    return {"role": "tool", "tool_call_id": call_id, "content": "21 C"}


UNASKED_CHATS = [
    ("no call at all", [ASK, chat_result("call_9")], 1, "call_9"),
    (
        "another call's id",
        [ASK, chat_call("call_1"), chat_result("call_2")],
        2,
        "call_2",
    ),
    (
        "the result before its call",
        [ASK, chat_result("call_1"), chat_call("call_1")],
        1,
        "call_1",
    ),
]


@pytest.mark.parametrize(
    "conversation, position, call_id",
    [case[1:] for case in UNASKED_CHATS],
    ids=[case[0] for case in UNASKED_CHATS],
)
def test_a_chat_tool_result_that_answers_no_call_is_refused(
    openai_client, conversation, position, call_id
):
    with pytest.raises(openai.BadRequestError) as caught:
        openai_client.chat.completions.create(
            model=MODEL, messages=conversation, max_tokens=2
        )
    error = caught.value.body
    field = f"messages[{position}].tool_call_id"
    assert error["param"] == field, error
    assert error["message"].startswith(f"{field} is {call_id!r}"), error
    assert "answers no call" in error["message"], error


def test_a_chat_tool_result_that_answers_its_call_passes(openai_client):
    answer = openai_client.chat.completions.create(
        model=MODEL,
        messages=[ASK, chat_call("call_1"), chat_result("call_1")],
        max_tokens=2,
    )
    assert answer.usage.completion_tokens >= 1


def test_a_function_call_output_that_answers_no_call_is_refused(openai_client):
    call = {
        "type": "function_call",
        "call_id": "call_1",
        "name": "get_weather",
        "arguments": ARGUMENTS,
    }
    output = {"type": "function_call_output", "call_id": "call_2", "output": "21 C"}
    with pytest.raises(openai.BadRequestError) as caught:
        openai_client.responses.create(
            model=MODEL, input=[ASK, call, output], max_output_tokens=2
        )
    error = caught.value.body
    assert error["param"] == "input[2].call_id", error
    assert "input[2].call_id is 'call_2', which answers no call" in error["message"]
    answer = openai_client.responses.create(  # its own id: answered
        model=MODEL,
        input=[ASK, call, {**output, "call_id": "call_1"}],
        max_output_tokens=2,
    )
    assert answer.status in ("completed", "incomplete")


def test_a_tool_result_block_that_answers_no_call_is_refused(anthropic_client):
    use = {
        "type": "tool_use",
        "id": "toolu_1",
        "name": "get_weather",
        "input": {"city": "Paris"},
    }
    result = {"type": "tool_result", "tool_use_id": "toolu_2", "content": "21 C"}
    conversation = [
        ASK,
        {"role": "assistant", "content": [use]},
        {"role": "user", "content": [result]},
    ]
    with pytest.raises(anthropic.BadRequestError) as caught:
        anthropic_client.messages.create(
            model=MODEL, messages=conversation, max_tokens=2
        )
    message = caught.value.body["error"]["message"]
    assert message.startswith(
        "messages[2].content[0].tool_use_id is 'toolu_2', which answers no call"
    ), message
    conversation[2] = {
        "role": "user",
        "content": [{**result, "tool_use_id": "toolu_1"}],
    }
    counted = anthropic_client.messages.count_tokens(model=MODEL, messages=conversation)
    assert counted.input_tokens > 0  # its own id: the same conversation passes


# The finding's schema: uniqueItems, which the grammar cannot enforce, let through
# by llguidance's lenient mode.
LENIENT = {"x-guidance": {"lenient": True}}
UNIQUE = {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}
OBJECT = {"type": "object", "properties": {"ids": UNIQUE}, "required": ["ids"]}
MESSAGES = [ASK]


def chat_tool(parameters: dict) -> dict:
    return {"type": "function", "function": {"name": "f", "parameters": parameters}}


def json_schema_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


# (what, path, body, the error's param (None: Anthropic's errors have none), the
# place the message names)
SCHEMA_ENTRIES = [
    (
        "chat response_format",
        "/v1/chat/completions",
        {"messages": MESSAGES, "response_format": json_schema_format(UNIQUE | LENIENT)},
        "response_format.json_schema.schema",
        "`x-guidance`",
    ),
    (
        "chat response_format, nested",
        "/v1/chat/completions",
        {
            "messages": MESSAGES,
            "response_format": json_schema_format(
                {"type": "object", "properties": {"ids": UNIQUE | LENIENT}}
            ),
        },
        "response_format.json_schema.schema",
        "`properties.ids.x-guidance`",
    ),
    (
        "vLLM guided_json",
        "/v1/chat/completions",
        {"messages": MESSAGES, "guided_json": UNIQUE | LENIENT},
        "guided_json",
        "`x-guidance`",
    ),
    (
        "chat tool parameters",
        "/v1/chat/completions",
        {"messages": MESSAGES, "tools": [chat_tool(OBJECT | LENIENT)]},
        "tools",
        "tools[0].function.parameters: `x-guidance`",
    ),
    (
        "completions response_format",
        "/v1/completions",
        {"prompt": "Ids:", "response_format": json_schema_format(UNIQUE | LENIENT)},
        "response_format.json_schema.schema",
        "`x-guidance`",
    ),
    (
        "Responses text.format",
        "/v1/responses",
        {
            "input": "Ids?",
            "text": {
                "format": {
                    "type": "json_schema",
                    "name": "x",
                    "schema": OBJECT | LENIENT,
                }
            },
        },
        "text.format.schema",
        "`x-guidance`",
    ),
    (
        "Responses tool parameters",
        "/v1/responses",
        {
            "input": "Ids?",
            "tools": [
                {"type": "function", "name": "f", "parameters": OBJECT | LENIENT}
            ],
        },
        "tools",
        "tools[0].parameters: `x-guidance`",
    ),
    (
        "Messages tool input_schema",
        "/v1/messages",
        {
            "messages": MESSAGES,
            "max_tokens": 2,
            "tools": [{"name": "f", "input_schema": OBJECT | LENIENT}],
        },
        None,
        "tools[0].input_schema: `x-guidance`",
    ),
    (
        "Messages output_config.format",
        "/v1/messages",
        {
            "messages": MESSAGES,
            "max_tokens": 2,
            "output_config": {
                "format": {"type": "json_schema", "schema": OBJECT | LENIENT}
            },
        },
        None,
        "`x-guidance`",
    ),
]


@pytest.mark.parametrize(
    "path, body, param, place",
    [entry[1:] for entry in SCHEMA_ENTRIES],
    ids=[entry[0] for entry in SCHEMA_ENTRIES],
)
def test_a_client_cannot_set_the_grammar_librarys_options(
    server, path, body, param, place
):
    headers = {"Authorization": f"Bearer {API_KEY}"}
    response = httpx.post(
        server.url + path, json=body, headers=headers, timeout=WAIT_S, verify=TLS
    )
    assert response.status_code == 400, response.text[:500]
    answer = response.json()
    if param is None:
        assert answer["type"] == "error", answer
        error = answer["error"]
    else:
        error = answer["error"]
        assert error["param"] == param, error
    assert place in error["message"], error["message"]
    assert "remove x-guidance" in error["message"], error["message"]
