"""Tools beside the other options agent frameworks send with them, in the
clients' own request shapes: stop strings (smolagents always sends them), a JSON
format beside tools (openai-agents' output_type with a tool, pydantic-ai's
NativeOutput, instructor's Mode.RESPONSES_TOOLS), and a tool_choice without
tools (llama-index's structured_predict), on the chat, Responses and Messages
APIs.

A stop string ends free text, never a call; with a format, an answer is calls or
JSON that the format's schema validates (jsonschema judges); a tool_choice
without tools is answered as if it were not there.
"""

import json

import jsonschema
import openai
import pytest

from tiny_llm_base.tool_prompts import CLOSE
from tiny_llm_serve.constraints import calls_or_answer
from tiny_llm_serve.stop_strings import StopStrings

from .helpers import call_text, grammar_accepts
from .servers import MODEL, package_server
from .solution import tiny

CITY = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}},
    "required": ["city"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": CITY,
    },
}
ANSWER = {
    "type": "object",
    "properties": {"answer": {"type": "string", "maxLength": 40}},
    "required": ["answer"],
    "additionalProperties": False,
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def running(protocol_model):
    # jump-forward: a call's tag, name and keys are forced text, verified in chunks
    with package_server(protocol_model, jump_forward=True) as server:
        yield server


# --- stop strings spare calls ---------------------------------------------------------


@pytest.mark.parametrize("size", [1, 3, 1000], ids=["by character", "by 3", "whole"])
def test_a_stop_string_inside_a_call_is_text_and_ends_the_text_after_it(size):
    """The call's argument holds the stop string and the closing tag; the free text
    after the call holds the stop string too: the answer ends there, the call whole."""
    call = call_text("f", {"q": f"a STOP b {CLOSE} STOP"})
    answer = f"Sure. {call} then STOP more"
    stops = StopStrings(["STOP"], calls=True)
    sent = "".join(
        stops.feed(answer[i : i + size]) for i in range(0, len(answer), size)
    )
    assert stops.stopped and stops.found == "STOP"
    assert sent + stops.flush() == f"Sure. {call} then "
    plain = StopStrings(["STOP"])  # without tools a stop string ends any text
    assert plain.feed(answer) == "Sure. " + call[: call.index("STOP")]


def test_a_stop_string_before_any_call_ends_the_answer():
    stops = StopStrings(["Obs"], calls=True)
    text = "Thought: look Obs " + call_text("f", {})
    assert stops.feed(text) == "Thought: look " and stops.stopped


def test_stop_with_tools_returns_whole_calls(running):
    """smolagents' shape: stop strings beside tools. Under "required" the call's
    JSON holds "city" and "}", both stop strings: the call comes back whole."""
    client = running.openai_client()
    options = dict(model=MODEL, messages=ASK, tools=[WEATHER], temperature=0)
    options |= dict(tool_choice="required", max_tokens=64, stop=["city", "}"])
    options |= dict(parallel_tool_calls=False)
    response = client.chat.completions.create(**options)
    [choice] = response.choices
    assert choice.finish_reason == "tool_calls", choice
    [call] = choice.message.tool_calls
    jsonschema.validate(json.loads(call.function.arguments), CITY)
    chunks = list(client.chat.completions.create(**options, stream=True))
    deltas = [
        d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []
    ]
    assert len(deltas) == 1
    jsonschema.validate(json.loads(deltas[0].function.arguments), CITY)


# --- a JSON format beside tools ----------------------------------------------------------


@pytest.mark.parametrize("parallel", [False, True])
def test_the_union_accepts_calls_or_the_format_and_nothing_else(tokenizer, parallel):
    calls = tiny.tool_constraint([WEATHER], "required", parallel)
    union = calls_or_answer(calls.lark, json.dumps(ANSWER))
    call = call_text("get_weather", {"city": "Paris"})
    assert grammar_accepts(union, tokenizer, call)
    assert grammar_accepts(union, tokenizer, '{"answer":"sunny"}')
    assert grammar_accepts(union, tokenizer, f"{call}\n{call}") == parallel
    for text in (
        "It is sunny.",
        '{"answer":1}',
        f'{call}{{"answer":"x"}}',
        call_text("delete_all_files", {}),
        call_text("get_weather", {"town": "Paris"}),
    ):
        assert not grammar_accepts(union, tokenizer, text), text


def check_answer(calls: list[tuple[str, str]], text: str | None) -> None:
    """Calls that validate, or else text that is JSON in the ANSWER format."""
    for name, arguments in calls:
        assert name == "get_weather"
        jsonschema.validate(json.loads(arguments), CITY)
    if not calls:
        jsonschema.validate(json.loads(text), ANSWER)


@pytest.mark.parametrize("temperature", [0, 1.0])
def test_chat_answers_with_a_call_or_in_the_format(running, temperature):
    """openai-agents' output_type with a tool, pydantic-ai's NativeOutput: tools
    and response_format json_schema in one chat request."""
    client = running.openai_client()
    response_format = {
        "type": "json_schema",
        "json_schema": {"name": "Answer", "schema": ANSWER, "strict": True},
    }
    response = client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        tools=[WEATHER],
        response_format=response_format,
        temperature=temperature,
        seed=3,
        max_tokens=96,
        parallel_tool_calls=False,
    )
    [choice] = response.choices
    assert choice.finish_reason in ("stop", "tool_calls"), choice
    calls = choice.message.tool_calls or []
    check_answer(
        [(c.function.name, c.function.arguments) for c in calls], choice.message.content
    )


@pytest.mark.parametrize("temperature", [0, 1.0])
def test_responses_answers_with_a_call_or_in_the_text_format(running, temperature):
    """instructor's Mode.RESPONSES_TOOLS: tools and text.format in one request."""
    client = running.openai_client()
    response = client.responses.create(
        model=MODEL,
        input=ASK,
        tools=[{"type": "function", "name": "get_weather", "parameters": CITY}],
        text={
            "format": {
                "type": "json_schema",
                "name": "Answer",
                "schema": ANSWER,
                "strict": True,
            }
        },
        temperature=temperature,
        max_output_tokens=96,
        parallel_tool_calls=False,
    )
    assert response.status == "completed", response
    calls = [
        (item.name, item.arguments)
        for item in response.output
        if item.type == "function_call"
    ]
    check_answer(calls, response.output_text)


# --- a tool_choice without tools -----------------------------------------------------------


def test_a_tool_choice_without_tools_is_answered_as_without_it(running):
    """llama-index's structured_predict sends tool_choice "required" and no tools;
    OpenAI answers it; so do the three APIs here: an answer in text, no call."""
    client = running.openai_client()
    chat = client.chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=8, tool_choice="required"
    )
    assert chat.choices[0].message.content and not chat.choices[0].message.tool_calls
    responses = client.responses.create(
        model=MODEL, input=ASK, max_output_tokens=16, tool_choice="required"
    )
    assert responses.status in ("completed", "incomplete"), responses
    assert responses.output_text
    assert all(item.type == "message" for item in responses.output)
    message = running.anthropic_client().messages.create(
        model=MODEL, messages=ASK, max_tokens=8, tool_choice={"type": "any"}
    )
    assert [block.type for block in message.content] == ["text"], message


def test_max_tool_calls_zero_calls_nothing_and_below_zero_is_refused(running):
    client = running.openai_client()
    tool = {"type": "function", "name": "get_weather", "parameters": CITY}
    options = dict(model=MODEL, input=ASK, tools=[tool], max_output_tokens=12)
    none = client.responses.create(
        **options, tool_choice="required", extra_body={"max_tool_calls": 0}
    )
    assert all(item.type == "message" for item in none.output), none.output
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(**options, extra_body={"max_tool_calls": -1})
    error = caught.value.body
    assert error["param"] == "max_tool_calls", error
    assert error["message"] == "max_tool_calls must be at least 0, got -1", error
