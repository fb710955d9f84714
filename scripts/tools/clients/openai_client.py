"""openai (the official Python client): the README's usages, pointed at the
server; greedy (temperature 0), so that the test suite's run of them
(tests/test_client_check.py) is the same every time."""

import json

from openai import OpenAI
from pydantic import BaseModel

from scripts.tools.clients import ServerAddress

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a given city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 20}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
ASK_WEATHER = [{"role": "user", "content": "What is the weather like in Paris?"}]


class CalendarEvent(BaseModel):
    name: str
    date: str


def client(server: ServerAddress) -> OpenAI:
    return OpenAI(base_url=server.v1, api_key=server.api_key, max_retries=0)


def chat(server: ServerAddress) -> None:
    completion = client(server).chat.completions.create(
        model=server.model,
        messages=[
            {"role": "developer", "content": "Talk like a pirate."},
            {"role": "user", "content": "How do I check if a Python object is a list?"},
        ],
        max_completion_tokens=16,
        temperature=0,
    )
    assert completion.choices[0].message.content, completion


def stream(server: ServerAddress) -> None:
    chunks = list(
        client(server).chat.completions.create(
            model=server.model,
            messages=[{"role": "user", "content": "Say this is a test"}],
            max_completion_tokens=16,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text, "no text in the stream"
    assert chunks[-1].usage and chunks[-1].usage.completion_tokens, chunks[-1]


def completions(server: ServerAddress) -> None:
    completion = client(server).completions.create(
        model=server.model, prompt="Say this is a test", max_tokens=7, temperature=0
    )
    assert completion.choices[0].text, completion


def models(server: ServerAddress) -> None:
    openai = client(server)
    assert server.model in [m.id for m in openai.models.list()]
    assert openai.models.retrieve(server.model).id == server.model


def parse(server: ServerAddress) -> None:
    completion = client(server).chat.completions.parse(
        model=server.model,
        messages=[
            {"role": "system", "content": "Extract the event information."},
            {"role": "user", "content": "Alice and Bob go to a fair on Friday."},
        ],
        response_format=CalendarEvent,
        max_completion_tokens=48,
        temperature=0,
    )
    assert isinstance(completion.choices[0].message.parsed, CalendarEvent)


def tool_call(server: ServerAddress, tool_choice) -> list:
    completion = client(server).chat.completions.create(
        model=server.model,
        messages=ASK_WEATHER,
        tools=[WEATHER],
        tool_choice=tool_choice,
        max_completion_tokens=48,
        temperature=0,
    )
    choice = completion.choices[0]
    calls = choice.message.tool_calls or []
    for call in calls:
        assert "city" in json.loads(call.function.arguments), call
    if calls:  # "length": max_tokens cut a later call (the model may call again)
        assert choice.finish_reason in ("tool_calls", "length"), choice
    return calls


def tools_auto(server: ServerAddress) -> None:
    tool_call(server, "auto")


def tools_required(server: ServerAddress) -> None:
    assert tool_call(server, "required"), "no tool call under required"


def tools_named(server: ServerAddress) -> None:
    named = {"type": "function", "function": {"name": "get_weather"}}
    assert tool_call(server, named), "no tool call under a named tool_choice"


def tool_round_trip(server: ServerAddress) -> None:
    calls = tool_call(server, "required")
    messages = [
        *ASK_WEATHER,
        {"role": "assistant", "tool_calls": [call.model_dump() for call in calls]},
        *({"role": "tool", "tool_call_id": c.id, "content": "18 C"} for c in calls),
    ]
    completion = client(server).chat.completions.create(
        model=server.model,
        messages=messages,
        tools=[WEATHER],
        max_completion_tokens=24,
        temperature=0,
    )
    assert completion.choices[0].finish_reason in ("stop", "length", "tool_calls")


def responses(server: ServerAddress) -> None:
    response = client(server).responses.create(
        model=server.model,
        instructions="You are a coding assistant that talks like a pirate.",
        input="How do I check if a Python object is an instance of a class?",
        max_output_tokens=16,
        temperature=0,
    )
    assert response.output_text, response


def responses_tool(server: ServerAddress) -> None:
    openai = client(server)
    tools = [{"type": "function", **WEATHER["function"]}]
    question = [{"role": "user", "content": "What is the weather like in Paris?"}]
    response = openai.responses.create(
        model=server.model,
        input=question,
        tools=tools,
        tool_choice="required",
        max_output_tokens=48,
        temperature=0,
    )
    calls = [item for item in response.output if item.type == "function_call"]
    assert calls, f"no function_call in {response.output}"
    results = [
        {"type": "function_call_output", "call_id": c.call_id, "output": "18 C"}
        for c in calls
    ]
    followup = openai.responses.create(
        model=server.model,
        input=question + response.output + results,
        tools=tools,
        max_output_tokens=24,
        temperature=0,
    )
    assert followup.status in ("completed", "incomplete"), followup


FEATURES = {
    "chat": chat,
    "stream + include_usage": stream,
    "completions": completions,
    "models.list / retrieve": models,
    "chat.completions.parse": parse,
    "tools auto": tools_auto,
    "tools required": tools_required,
    "tools named": tools_named,
    "tool round trip": tool_round_trip,
    "responses.create": responses,
    "responses + function tool": responses_tool,
}
