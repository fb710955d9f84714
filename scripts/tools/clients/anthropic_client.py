"""anthropic (the official Python client): the README's usages, pointed at the
server (base_url without /v1: the client adds /v1/messages); greedy, as
openai_client's."""

import anthropic

from scripts.tools.clients import ServerAddress

WEATHER = {
    "name": "get_weather",
    "description": "Get the current weather in a given city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}},
        "required": ["city"],
    },
}
HELLO = [{"role": "user", "content": "Hello, Claude"}]
# This client version has no temperature argument; the API still takes the field.
GREEDY = {"temperature": 0}


def client(server: ServerAddress) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=server.url, api_key=server.api_key, max_retries=0
    )


def create(server: ServerAddress) -> None:
    message = client(server).messages.create(
        max_tokens=16, messages=HELLO, model=server.model, extra_body=GREEDY
    )
    assert message.content and message.content[0].text, message


def stream(server: ServerAddress) -> None:
    with client(server).messages.stream(
        max_tokens=16, messages=HELLO, model=server.model, extra_body=GREEDY
    ) as stream:
        text = "".join(stream.text_stream)
    assert text and stream.get_final_message().usage.output_tokens, text


def tool_round_trip(server: ServerAddress) -> None:
    claude = client(server)
    question = [{"role": "user", "content": "What is the weather like in Paris?"}]
    message = claude.messages.create(
        model=server.model,
        max_tokens=64,
        extra_body=GREEDY,
        tools=[WEATHER],
        tool_choice={"type": "any"},
        messages=question,
    )
    uses = [block for block in message.content if block.type == "tool_use"]
    assert uses and "city" in uses[0].input, message
    results = [
        {"type": "tool_result", "tool_use_id": use.id, "content": "18 C"}
        for use in uses
    ]
    reply = claude.messages.create(
        model=server.model,
        max_tokens=24,
        extra_body=GREEDY,
        tools=[WEATHER],
        messages=[
            *question,
            {"role": "assistant", "content": message.content},
            {"role": "user", "content": results},
        ],
    )
    assert reply.stop_reason in ("end_turn", "max_tokens", "tool_use"), reply


FEATURES = {
    "messages.create": create,
    "messages.stream": stream,
    "tool_use / tool_result round trip": tool_round_trip,
}
