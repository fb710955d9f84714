"""The server's tool calls (week 4 day 2), through the official openai client.

Every call the server returns is checked by the jsonschema package against its
function's parameters; the stream's tool-call deltas are what the openai client
assembles; earlier calls and their results are accepted in the history; bad tool
input is a 400 in OpenAI's error shape naming the field.
"""

import json

import jsonschema
import openai
import pytest

from tiny_llm_serve.tool_answers import CallSplitter

from .servers import MODEL, package_server
from .solution import tiny

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 20},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "parameters": {
            "type": "object",
            "properties": {
                "a": {"type": "integer", "minimum": -99, "maximum": 99},
                "b": {"type": "integer", "minimum": -99, "maximum": 99},
            },
            "required": ["a", "b"],
            "additionalProperties": False,
        },
    },
}
TOOLS = [WEATHER, ADD]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def client(protocol_model):
    """The server on a random model: the grammar, not the model, makes its calls."""
    with package_server(protocol_model) as running:
        yield running.openai_client()


def assert_valid_call(call) -> None:
    [tool] = [t for t in TOOLS if t["function"]["name"] == call.function.name]
    assert call.type == "function" and call.id.startswith("call_")
    jsonschema.validate(
        json.loads(call.function.arguments), tool["function"]["parameters"]
    )


# One call required, greedy or sampled; max_tokens holds the whole call.
REQUIRED = dict(
    model=MODEL,
    messages=ASK,
    tools=TOOLS,
    tool_choice="required",
    parallel_tool_calls=False,
    max_tokens=64,
)


@pytest.fixture(scope="module")
def greedy_required(client):
    """The greedy answer to REQUIRED, asked once: two tests read the same tokens."""
    return client.chat.completions.create(**REQUIRED, temperature=0)


@pytest.mark.parametrize("temperature", [0, 1.0])
def test_required_calls_validate(client, greedy_required, temperature):
    if temperature == 0:
        response = greedy_required
    else:
        response = client.chat.completions.create(**REQUIRED, temperature=temperature)
    [choice] = response.choices
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    assert_valid_call(call)
    assert choice.message.content is None


def test_a_named_function_is_the_one_called(client):
    response = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Add 2 and 3."}],
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "add"}},
        parallel_tool_calls=False,
        temperature=0,
        max_tokens=64,
    )
    [call] = response.choices[0].message.tool_calls
    assert call.function.name == "add"
    assert_valid_call(call)


# instructor's Mode.TOOLS asks for its model by name; greedy, the embedded model
# calls this function twice when a second call is allowed.
USER = {
    "type": "function",
    "function": {
        "name": "User",
        "parameters": {
            "type": "object",
            "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
            "required": ["name", "age"],
        },
    },
}


def test_a_named_function_is_called_once_even_with_parallel_calls(model_client):
    response = model_client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "John is 25 years old"}],
        tools=[USER],
        tool_choice={"type": "function", "function": {"name": "User"}},
        temperature=0,
        max_tokens=96,
    )
    [choice] = response.choices
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    jsonschema.validate(
        json.loads(call.function.arguments), USER["function"]["parameters"]
    )


def test_a_streamed_call_arrives_whole_as_a_tool_call_delta(client):
    stream = client.chat.completions.create(
        **REQUIRED,
        temperature=0,
        stream=True,
    )
    deltas, text, reasons = [], "", []
    for chunk in stream:
        for choice in chunk.choices:
            deltas += choice.delta.tool_calls or []
            text += choice.delta.content or ""
            reasons.append(choice.finish_reason)
    [delta] = deltas
    assert delta.index == 0
    assert_valid_call(delta)
    assert "<tool_call>" not in text and text.strip() == ""
    assert reasons[-1] == "tool_calls"


# An argument the grammar forces to hold the close tag's text.
TAG = "</tool_call>"
ECHO = {
    "type": "function",
    "function": {
        "name": "echo",
        "parameters": {
            "type": "object",
            "properties": {"text": {"const": TAG}},
            "required": ["text"],
            "additionalProperties": False,
        },
    },
}


def test_a_call_whose_argument_holds_the_close_tag_comes_back_whole(client):
    """The server's reading of an answer (the stream's is the next test's)."""
    options = dict(model=MODEL, messages=ASK, tools=[ECHO], tool_choice="required")
    options |= dict(parallel_tool_calls=False, temperature=0, max_tokens=48)
    [choice] = client.chat.completions.create(**options).choices
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    [call] = choice.message.tool_calls
    assert json.loads(call.function.arguments) == {"text": TAG}


def test_a_stream_holds_a_call_until_the_tag_that_ends_it():
    """Fed a character at a time, a call whose argument holds the close tag is one
    call and no content: the tag inside the JSON ends nothing."""
    arguments = {"city": "</tool_call>"}
    body = json.dumps({"name": "get_weather", "arguments": arguments})
    splitter, text, calls = CallSplitter(tiny.parse_tool_calls), "", []
    for character in f"Sure. <tool_call>\n{body}\n</tool_call>":
        piece, found = splitter.feed(character)
        text, calls = text + piece, calls + found
    text += splitter.flush()
    assert text == "Sure. "
    assert [(c.name, c.arguments) for c in calls] == [("get_weather", arguments)]


def test_a_call_cut_at_max_tokens_is_its_text_with_finish_reason_length(client):
    # The only call is cut: the answer is the open tag and part of its JSON, as
    # content (never an empty answer, never a call that was not whole).
    options = dict(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required")
    options |= dict(temperature=0, max_tokens=10)
    response = client.chat.completions.create(**options)
    [choice] = response.choices
    assert choice.finish_reason == "length"
    assert choice.message.tool_calls is None
    assert choice.message.content.startswith("<tool_call>\n{"), choice.message
    assert response.usage.completion_tokens == 10
    chunks = list(client.chat.completions.create(**options, stream=True))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed.startswith("<tool_call>\n{"), streamed
    assert not any(c.choices[0].delta.tool_calls for c in chunks if c.choices)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_none_never_calls_and_auto_answers_in_text_or_calls(client):
    for choice_name in ("none", "auto"):
        response = client.chat.completions.create(
            model=MODEL,
            messages=ASK,
            tools=TOOLS,
            tool_choice=choice_name,
            temperature=0,
            max_tokens=24,
        )
        message = response.choices[0].message
        if choice_name == "none":
            assert message.tool_calls is None
        for call in message.tool_calls or []:
            assert_valid_call(call)
        assert "<tool_call>" not in (message.content or "")


def test_a_call_and_its_result_go_back_into_the_conversation(client, greedy_required):
    [call] = greedy_required.choices[0].message.tool_calls
    history = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"celsius": 21}'},
    ]
    second = client.chat.completions.create(
        model=MODEL, messages=history, tools=TOOLS, temperature=0, max_tokens=16
    )
    assert second.choices[0].finish_reason in ("stop", "length", "tool_calls")


BAD = [
    (
        {
            "tools": TOOLS,
            "tool_choice": {"type": "function", "function": {"name": "x"}},
        },
        "tool_choice",
        "which is not in tools",
    ),
    ({"tools": [{"type": "retrieval"}]}, "tools", "only function tools"),
    (
        {
            "tools": [
                {
                    "type": "function",
                    "function": {
                        "name": "f",
                        "parameters": {"type": "object", "not": {"type": "null"}},
                    },
                }
            ]
        },
        "tools",
        "tools[0].function.parameters",
    ),
    (
        {"tools": TOOLS, "response_format": {"type": "json_object"}, "stop": ["x"]},
        "stop",
        "cannot be combined with tools",
    ),
    (
        {"tools": TOOLS, "guided_regex": "[0-9]+"},
        "guided_regex",
        "cannot be combined with tools: beside tools, give at most one JSON format",
    ),
    ({"functions": [WEATHER["function"]]}, "functions", "send tools"),
]


@pytest.mark.parametrize("extra, param, message", BAD)
def test_bad_tool_input_is_a_400_naming_the_field(client, extra, param, message):
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model=MODEL, messages=ASK, max_tokens=4, extra_body=extra
        )
    error = caught.value.body
    assert error["param"] == param, error
    assert message in error["message"], error


def test_a_tool_message_needs_the_id_of_its_call(client):
    history = ASK + [{"role": "tool", "content": "21"}]
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=history, max_tokens=4)
    assert "tool_call_id" in caught.value.body["message"]
