"""langchain-openai: ChatOpenAI's documented usages (invoke, stream,
with_structured_output in each method, bind_tools), pointed at the server."""

import openai
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field

from scripts.tools.clients import ModelAnswer, ServerAddress, cut_short

LONG = 96  # tokens for a structured answer or a call


class Joke(BaseModel):
    """Joke to tell user."""

    setup: str = Field(description="The setup of the joke")
    punchline: str = Field(description="The punchline to the joke")


class GetWeather(BaseModel):
    """Get the current weather in a given location."""

    location: str = Field(..., description="The city, e.g. San Francisco")


def chat(server: ServerAddress, max_tokens: int = 16) -> ChatOpenAI:
    return ChatOpenAI(
        model=server.model,
        base_url=server.v1,
        api_key=server.api_key,
        max_tokens=max_tokens,
        max_retries=0,
    )


def invoke(server: ServerAddress) -> None:
    message = chat(server).invoke("Translate to French: I love programming.")
    assert message.content, message


def stream(server: ServerAddress) -> None:
    pieces = [c.content for c in chat(server).stream("Write a haiku about the sea.")]
    assert "".join(pieces), pieces


def structured(method: str | None):
    def feature(server: ServerAddress) -> None:
        options = {"method": method} if method else {}
        runnable = chat(server, LONG).with_structured_output(
            Joke, include_raw=True, **options
        )
        try:
            result = runnable.invoke(
                "Tell me a joke about cats, respond in JSON with `setup` and "
                "`punchline` keys"
            )
        except openai.LengthFinishReasonError as error:
            raise cut_short(error.completion.choices[0].message.content, LONG) from None
        if isinstance(result["parsed"], Joke):
            return
        raw = result["raw"]
        if raw.response_metadata.get("finish_reason") == "length":
            raise cut_short(raw.content or str(raw.tool_calls), LONG)
        if method == "json_mode":  # json_object holds it to an object, not to Joke
            raise ModelAnswer(f"a JSON object, not a Joke: {raw.content[:70]}")
        raise AssertionError(f"not parsed: {result['parsing_error']!r}; raw {raw}")

    return feature


def bind_tools(server: ServerAddress) -> None:
    with_tools = chat(server, LONG).bind_tools([GetWeather], tool_choice="any")
    message = with_tools.invoke("What is the weather like in San Francisco?")
    if (
        not message.tool_calls
        and message.response_metadata["finish_reason"] == "length"
    ):
        raise cut_short("the call (not returned: it never closed)", LONG)
    assert message.tool_calls, message
    assert all("location" in call["args"] for call in message.tool_calls), message


FEATURES = {
    "invoke": invoke,
    "stream": stream,
    "with_structured_output (default)": structured(None),
    "with_structured_output json_schema": structured("json_schema"),
    "with_structured_output json_mode": structured("json_mode"),
    "with_structured_output function_calling": structured("function_calling"),
    "bind_tools": bind_tools,
}
