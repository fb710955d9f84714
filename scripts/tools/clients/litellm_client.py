"""litellm: completion() and text_completion() with an "openai/" model name and
api_base, as its docs address an OpenAI-compatible server."""

import json

import litellm

from scripts.tools.clients import ServerAddress

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_current_weather",
        "description": "Get the current weather in a given location",
        "parameters": {
            "type": "object",
            "properties": {"location": {"type": "string", "maxLength": 30}},
            "required": ["location"],
        },
    },
}


def options(server: ServerAddress) -> dict:
    return {
        "model": f"openai/{server.model}",
        "api_base": server.v1,
        "api_key": server.api_key,
        "max_tokens": 16,
    }


def chat(server: ServerAddress) -> None:
    messages = [{"content": "Hello, how are you?", "role": "user"}]
    response = litellm.completion(messages=messages, **options(server))
    assert response.choices[0].message.content, response


def stream(server: ServerAddress) -> None:
    messages = [{"content": "Hello, how are you?", "role": "user"}]
    chunks = litellm.completion(messages=messages, stream=True, **options(server))
    assert "".join(c.choices[0].delta.content or "" for c in chunks)


def completions(server: ServerAddress) -> None:
    response = litellm.text_completion(prompt="Good morning,", **options(server))
    assert response.choices[0].text, response


def tools(server: ServerAddress) -> None:
    messages = [{"role": "user", "content": "What's the weather like in Boston?"}]
    response = litellm.completion(
        messages=messages,
        tools=[WEATHER],
        tool_choice="required",
        **options(server) | {"max_tokens": 64},
    )
    calls = response.choices[0].message.tool_calls
    assert calls, response
    assert all("location" in json.loads(c.function.arguments) for c in calls)


FEATURES = {
    "chat": chat,
    "stream": stream,
    "completions": completions,
    "tools": tools,
}
