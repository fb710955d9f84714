"""The OpenAI Responses API (POST /v1/responses), through the official openai
client's `responses.create`.

The client is the independent implementation of the wire format: it parses
every object and stream event into its own types. The answers are compared with
the chat route's for the same conversation under greedy decoding (the same
engine reached by another path), function calls are checked by the jsonschema
package against their function's parameters, and a structured answer against
its schema. Fields the server cannot honour are a 400 naming them.
"""

import json

import jsonschema
import openai
import pytest

from .servers import (
    MAX_SEQ_LEN,
    MODEL,
    broken_server,
    package_server,
)

QUESTION = "What is the capital of France?"
WEATHER_PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}},
    "required": ["city"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather in a city.",
    "parameters": WEATHER_PARAMETERS,
}
# The same tool as the chat route takes it.
CHAT_WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": WEATHER_PARAMETERS,
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def client(protocol_model):
    """The server on a random model: what these tests check is the API's shape."""
    with package_server(protocol_model) as running:
        yield running.openai_client()


def chat(client, messages, max_tokens, **extra):
    """The chat route's greedy answer to the same conversation."""
    return client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=max_tokens, temperature=0, **extra
    )


def test_a_plain_answer_is_the_chat_routes(client):
    response = client.responses.create(
        model=MODEL,
        instructions="Answer in one short sentence.",
        input=QUESTION,
        max_output_tokens=12,
        temperature=0,
    )
    expected = chat(
        client,
        [
            {"role": "system", "content": "Answer in one short sentence."},
            {"role": "user", "content": QUESTION},
        ],
        12,
    )
    assert response.object == "response" and response.id.startswith("resp_")
    [message] = response.output
    assert message.type == "message" and message.role == "assistant"
    assert response.output_text == expected.choices[0].message.content
    assert response.usage.input_tokens == expected.usage.prompt_tokens
    assert response.usage.output_tokens == expected.usage.completion_tokens
    assert response.usage.total_tokens == expected.usage.total_tokens
    finished = expected.choices[0].finish_reason
    assert response.status == ("incomplete" if finished == "length" else "completed")


def test_an_empty_tool_list_offers_none(client):
    # The Agents SDK sends tools: [] for an agent without tools.
    response = client.responses.create(
        model=MODEL, input=QUESTION, tools=[], max_output_tokens=8, temperature=0
    )
    expected = chat(client, [{"role": "user", "content": QUESTION}], 8)
    assert response.output_text == expected.choices[0].message.content
    assert response.usage.input_tokens == expected.usage.prompt_tokens
    assert response.tools == []


def test_an_answer_cut_at_max_output_tokens_is_incomplete(client):
    response = client.responses.create(
        model=MODEL, input=QUESTION, max_output_tokens=2, temperature=0
    )
    assert response.status == "incomplete"
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.output_tokens == 2
    assert response.output[0].status == "incomplete"


def test_message_items_and_text_parts_make_the_same_chat(client):
    items = [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
        {"type": "message", "role": "assistant", "content": "Hello!"},
        {"role": "user", "content": QUESTION},
    ]
    response = client.responses.create(
        model=MODEL, input=items, max_output_tokens=8, temperature=0
    )
    expected = chat(
        client,
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": QUESTION},
        ],
        8,
    )
    assert response.output_text == expected.choices[0].message.content
    assert response.usage.input_tokens == expected.usage.prompt_tokens


def test_a_streamed_answer_is_the_whole_ones(client):
    whole = client.responses.create(
        model=MODEL, input=QUESTION, max_output_tokens=10, temperature=0
    )
    events = list(
        client.responses.create(
            model=MODEL,
            input=QUESTION,
            max_output_tokens=10,
            temperature=0,
            stream=True,
        )
    )
    kinds = [event.type for event in events]
    last = (
        "response.incomplete" if whole.status == "incomplete" else "response.completed"
    )
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        last,
    ]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == whole.output_text
    assert events[-4].text == whole.output_text
    final = events[-1].response
    assert final.output_text == whole.output_text
    assert final.usage.output_tokens == whole.usage.output_tokens
    assert final.id == events[0].response.id


def test_a_function_call_round_trip(client):
    first = client.responses.create(
        model=MODEL,
        input=ASK,
        tools=[WEATHER],
        tool_choice="required",
        parallel_tool_calls=False,
        max_output_tokens=64,
        temperature=0,
    )
    assert first.status == "completed"
    [call] = first.output
    assert call.type == "function_call" and call.name == "get_weather"
    jsonschema.validate(json.loads(call.arguments), WEATHER_PARAMETERS)
    result = {"type": "function_call_output", "call_id": call.call_id}
    result["output"] = '{"celsius": 21}'
    second = client.responses.create(
        model=MODEL,
        input=ASK + first.output + [result],
        tools=[WEATHER],
        max_output_tokens=12,
        temperature=0,
    )
    chat_call = {
        "id": call.call_id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }
    history = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [chat_call]},
        {"role": "tool", "tool_call_id": call.call_id, "content": '{"celsius": 21}'},
    ]
    expected = chat(client, history, 12, tools=[CHAT_WEATHER])
    assert second.usage.input_tokens == expected.usage.prompt_tokens
    answer = expected.choices[0].message
    assert second.output_text == (answer.content or "")
    got_calls = [item for item in second.output if item.type == "function_call"]
    assert len(got_calls) == len(answer.tool_calls or [])


def test_a_streamed_function_call(client):
    stream = client.responses.create(
        model=MODEL,
        input=ASK,
        tools=[WEATHER],
        tool_choice={"type": "function", "name": "get_weather"},
        parallel_tool_calls=False,
        max_output_tokens=64,
        temperature=0,
        stream=True,
    )
    events = list(stream)
    kinds = [event.type for event in events]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    arguments = events[4].arguments
    assert events[3].delta == arguments
    jsonschema.validate(json.loads(arguments), WEATHER_PARAMETERS)
    [call] = events[-1].response.output
    assert call.type == "function_call" and call.arguments == arguments


def test_a_named_function_is_called_once_even_with_parallel_calls(model_client):
    # Greedy, the embedded model calls this function twice when it may.
    user = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
    }
    response = model_client.responses.create(
        model=MODEL,
        input="John is 25 years old",
        tools=[{"type": "function", "name": "User", "parameters": user}],
        tool_choice={"type": "function", "name": "User"},
        max_output_tokens=96,
        temperature=0,
    )
    assert response.status == "completed"
    [call] = response.output
    assert call.type == "function_call" and call.name == "User"
    jsonschema.validate(json.loads(call.arguments), user)


CITY = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "population": {"type": "integer", "minimum": 0},
    },
    "required": ["city", "population"],
    "additionalProperties": False,
}


def test_text_format_json_schema_holds_the_answer_to_the_schema(model_client):
    response = model_client.responses.create(
        model=MODEL,
        input="Name a big city and its population.",
        text={
            "format": {
                "type": "json_schema",
                "name": "city",
                "schema": CITY,
                "strict": True,
            }
        },
        max_output_tokens=48,
        temperature=0,
    )
    assert response.status == "completed"
    jsonschema.validate(json.loads(response.output_text), CITY)
    assert response.text.format.type == "json_schema"


def test_json_object_format_answers_an_object(client):
    response = client.responses.create(
        model=MODEL,
        input="Describe Paris as JSON.",
        text={"format": {"type": "json_object"}},
        max_output_tokens=48,
        temperature=0,
    )
    if response.status == "completed":
        assert isinstance(json.loads(response.output_text), dict)
    else:  # cut at max_output_tokens: what came is an object's beginning
        assert response.output_text.startswith("{")


BAD = [
    ({"previous_response_id": "resp_1"}, "previous_response_id", "not stored"),
    ({"store": True}, "store", "not stored"),
    ({"reasoning": {"effort": "low"}}, "reasoning", "does not reason"),
    ({"background": True}, "background", "background"),
    ({"top_logprobs": 2}, "top_logprobs", "log-probabilities are not returned"),
    ({"top_logprobs": 50}, "top_logprobs", "log-probabilities are not returned"),
    (
        {"include": ["message.output_text.logprobs"]},
        "include",
        "no extra output data",
    ),
    ({"tools": [{"type": "web_search"}]}, "tools", "'web_search' tools"),
    (
        {"tools": [WEATHER], "tool_choice": {"type": "function", "name": "x"}},
        "tool_choice",
        "not in tools",
    ),
    (
        {"tools": [{**WEATHER, "parameters": {"type": "object", "not": {}}}]},
        "tools",
        "tools[0].parameters",
    ),
    ({"text": {"format": {"type": "json_schema"}}}, "text.format.schema", "required"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type", "items"),
    (
        {"input": [{"role": "user", "content": [{"type": "input_image"}]}]},
        "input[0].content",
        "text only",
    ),
    ({"temperature": 2.5}, "temperature", "[0, 2]"),
    ({"max_output_tokens": MAX_SEQ_LEN}, "input", "context"),
]


@pytest.mark.parametrize("extra, param, message", BAD)
def test_what_cannot_be_honoured_is_a_400_naming_the_field(
    client, extra, param, message
):
    body = {"input": QUESTION, "max_output_tokens": 4, **extra}
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model=MODEL, **body)
    error = caught.value.body
    assert error["param"] == param, error
    assert message in error["message"], error
    assert error["type"] == "invalid_request_error"


def test_an_engine_that_raises_ends_the_stream_with_an_error_event(embedded_model):
    vocab_size = embedded_model[0].args.vocab_size
    with broken_server(embedded_model[1], vocab_size) as running:
        broken = running.openai_client(api_key="none")
        stream = broken.responses.create(
            model=MODEL, input=QUESTION, max_output_tokens=2, stream=True
        )
        events = list(stream)
        assert [e.type for e in events] == [
            "response.created",
            "response.in_progress",
            "error",
        ]
        assert "Week 2 Day 6" in events[-1].message
        with pytest.raises(openai.InternalServerError) as caught:  # then 503
            broken.responses.create(model=MODEL, input=QUESTION, max_output_tokens=2)
        assert caught.value.status_code == 503
        assert "restart" in caught.value.body["message"]
