"""pydantic-ai: an Agent on OpenAIChatModel with OpenAIProvider(base_url=...), as
its docs point it at an OpenAI-compatible server: text, a streamed run, a
function tool, and a structured output_type (its default output mode: a tool)."""

import asyncio

from pydantic import BaseModel
from pydantic_ai import Agent
from pydantic_ai.messages import ToolReturnPart
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from scripts.tools.clients import ModelAnswer, ServerAddress

SETTINGS = {"max_tokens": 96}


class CityLocation(BaseModel):
    city: str
    country: str


def agent(server: ServerAddress, **options) -> Agent:
    provider = OpenAIProvider(base_url=server.v1, api_key=server.api_key)
    model = OpenAIChatModel(server.model, provider=provider)
    return Agent(model, model_settings=SETTINGS, **options)


def text(server: ServerAddress) -> None:
    result = agent(server, instructions="Be concise, reply with one sentence.")
    output = result.run_sync('Where does "hello world" come from?').output
    assert isinstance(output, str) and output, output


def stream(server: ServerAddress) -> None:
    async def main() -> str:
        async with agent(server).run_stream("What is the capital of the UK?") as run:
            return "".join([piece async for piece in run.stream_text(delta=True)])

    assert asyncio.run(main())


def function_tool(server: ServerAddress) -> None:
    dice = agent(server, instructions="Roll the die with the tool, then answer.")

    @dice.tool_plain
    def roll_dice() -> str:
        """Roll a six-sided die and return the result."""
        return "4"

    result = dice.run_sync("Roll the die for me.")
    returned = [
        part
        for message in result.all_messages()
        for part in message.parts
        if isinstance(part, ToolReturnPart) and part.tool_name == "roll_dice"
    ]
    if not returned:
        raise ModelAnswer(
            f"tool_choice auto, it answered without a call: {result.output[:60]}"
        )


def tool_output(server: ServerAddress) -> None:
    result = agent(server, output_type=CityLocation).run_sync(
        "Where were the olympics held in 2012?"
    )
    assert isinstance(result.output, CityLocation), result.output


FEATURES = {
    "text": text,
    "stream": stream,
    "function tool": function_tool,
    "default (tool) output": tool_output,
}
