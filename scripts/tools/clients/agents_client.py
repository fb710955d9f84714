"""openai-agents (the Agents SDK): the quickstart's Agent and Runner, with the
SDK's default model class (OpenAIResponsesModel: POST /v1/responses) and with
OpenAIChatCompletionsModel (chat completions), both on an AsyncOpenAI client
pointed at the server; tracing off (it would upload to OpenAI)."""

import asyncio

from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from agents.exceptions import ModelBehaviorError
from openai import AsyncOpenAI
from pydantic import BaseModel

from scripts.tools.clients import ModelAnswer, ServerAddress

set_tracing_disabled(True)
SETTINGS = ModelSettings(max_tokens=96)


class CalendarEvent(BaseModel):
    name: str
    date: str


@function_tool
def get_weather(city: str) -> str:
    """Get the current weather in a city."""
    return f"The weather in {city} is sunny."


def model(server: ServerAddress, kind):
    client = AsyncOpenAI(base_url=server.v1, api_key=server.api_key, max_retries=0)
    return kind(model=server.model, openai_client=client)


def no_tools(kind):
    def feature(server: ServerAddress) -> None:
        agent = Agent(
            name="Assistant",
            instructions="You are a helpful assistant",
            model=model(server, kind),
            model_settings=SETTINGS,
        )
        result = Runner.run_sync(agent, "Write a haiku about recursion.")
        assert isinstance(result.final_output, str) and result.final_output

    return feature


def streamed(kind):
    def feature(server: ServerAddress) -> None:
        agent = Agent(name="Joker", model=model(server, kind), model_settings=SETTINGS)

        async def main() -> str:
            result = Runner.run_streamed(agent, input="Tell me a joke.")
            deltas = []
            async for event in result.stream_events():
                if event.type == "raw_response_event" and hasattr(event.data, "delta"):
                    deltas.append(event.data.delta)
            return "".join(d for d in deltas if isinstance(d, str))

        assert asyncio.run(main())

    return feature


def output_type(kind):
    def feature(server: ServerAddress) -> None:
        agent = Agent(
            name="Calendar extractor",
            instructions="Extract calendar events from text",
            output_type=CalendarEvent,
            model=model(server, kind),
            model_settings=SETTINGS,
        )
        result = Runner.run_sync(agent, "Alice and Bob go to a fair on Friday.")
        assert isinstance(result.final_output, CalendarEvent), result.final_output

    return feature


def tool(kind):
    def feature(server: ServerAddress) -> None:
        # tool_choice "required" makes the small model call; the SDK then resets
        # it (reset_tool_choice), so the next turn can answer in text. The model
        # may call again and again: 384 tokens hold the server's 8 calls (a call of
        # get_weather is ~30 tokens; 256 did not always hold them).
        settings = ModelSettings(max_tokens=384, tool_choice="required")
        agent = Agent(
            name="Weather agent",
            instructions="You are a helpful agent.",
            tools=[get_weather],
            model=model(server, kind),
            model_settings=settings,
        )
        try:
            result = Runner.run_sync(agent, "What's the weather in Tokyo?")
        except ModelBehaviorError as error:  # the SDK refuses a cut answer
            if "reason='max_output_tokens'" not in str(error):
                raise
            raise ModelAnswer(
                "a turn cut at max_output_tokens=384 (status incomplete, as "
                "OpenAI marks it), which the SDK refuses"
            ) from None
        outputs = [i for i in result.new_items if i.type == "tool_call_output_item"]
        assert outputs, f"no tool call in {result.new_items}"
        assert isinstance(result.final_output, str), result.final_output

    return feature


FEATURES = {}
for label, kind in (
    ("Responses", OpenAIResponsesModel),
    ("ChatCompletions", OpenAIChatCompletionsModel),
):
    FEATURES |= {
        f"{label}: no tools": no_tools(kind),
        f"{label}: streamed": streamed(kind),
        f"{label}: output_type": output_type(kind),
        f"{label}: function tool": tool(kind),
    }
