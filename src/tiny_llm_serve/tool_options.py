"""The chat body's tool fields (OpenAI's function calling): `tools`, `tool_choice`,
`parallel_tool_calls`, and the messages that carry earlier calls and their results.

The tools' schemas are checked where the grammar is made (the package's
tool_constraint, through the constraint factory), so a schema the structured-output
library cannot compile is a 400 naming `tools`; here only the shapes are checked.
"""

from typing import Annotated, Any

from pydantic import PlainValidator

from .errors import short
from .validation import Refusal, RequestModel, expect

TOOL_CHOICES = ("auto", "required", "none")


def tool_list(tools) -> list[dict] | None:
    if tools is None:
        return None
    if not isinstance(tools, list) or not tools:
        raise Refusal(
            'must be a non-empty list of {"type": "function", "function": {...}} '
            "tools (leave tools out to offer none)"
        )
    for i, tool in enumerate(tools):
        if not (isinstance(tool, dict) and tool.get("type") == "function"):
            raise Refusal(
                'must be {"type": "function", "function": {"name": ..., '
                '"parameters": {...}}}: only function tools are supported',
                at=f"tools[{i}]",
            )
    return tools


def tool_choice_value(choice) -> Any:
    if choice is None or choice in TOOL_CHOICES:
        return choice
    if (
        isinstance(choice, dict)
        and choice.get("type") == "function"
        and isinstance((choice.get("function") or {}).get("name"), str)
    ):
        return choice
    raise Refusal(
        'must be "auto", "required", "none" or {"type": "function", "function": '
        '{"name": ...}}'
    )


def refuse_unknown_tool(
    named: str, names: list, field: str = "tool_choice", lead: str = "names"
) -> None:
    """A tool_choice that names a tool must name one of `names`, the tools given
    (chat, responses and messages bodies alike): else a Refusal of `field` saying
    which it named and which it may. lead: the message's verb, "names" where the
    field is the choice object, "is" where it is the name itself."""
    if named not in names:
        raise Refusal(
            f"{lead} {short(named)}, which is not in tools: name one of {names}",
            field=field,
        )


def parallel_calls(parallel_tool_calls: bool | None, tool_choice) -> bool:
    """Whether an answer may hold several calls: parallel_tool_calls (default
    true), except under a named tool_choice, which asks for one call of that
    function, as vLLM's named function calling answers it. A small model asked
    for a function by name otherwise tends to call it again and again (the
    embedded model, greedy, calls an extraction function twice)."""
    return parallel_tool_calls is not False and not isinstance(tool_choice, dict)


class FunctionCall(RequestModel):
    """An earlier call's function: its name and its arguments as JSON text."""

    name: Annotated[str, expect("a string")] = None
    arguments: Annotated[str, expect("a string of JSON")] = "{}"


class ToolCallMessage(RequestModel):
    """One call in an assistant message's tool_calls."""

    id: Annotated[str, expect("a string")] = None
    type: Annotated[str, expect('"function"')] = "function"
    function: Annotated[FunctionCall, expect("an object with name and arguments")] = (
        None
    )


class ToolFields(RequestModel):
    """The tool fields of a chat body."""

    tools: Annotated[list[dict] | None, PlainValidator(tool_list)] = None
    tool_choice: Annotated[Any, PlainValidator(tool_choice_value)] = None
    parallel_tool_calls: Annotated[bool | None, expect("true or false")] = None

    def tools_offered(self) -> list[dict] | None:
        """The tools the model is told about: none under tool_choice "none"."""
        return None if self.tool_choice == "none" else self.tools

    def check_tool_choice(self) -> None:
        if (
            self.tool_choice is not None
            and not self.tools
            and self.tool_choice != ("none")
        ):
            raise Refusal(
                "needs tools: give the functions the model may call in tools",
                field="tool_choice",
            )
        if isinstance(self.tool_choice, dict) and self.tools:
            names = [(t.get("function") or {}).get("name") for t in self.tools]
            refuse_unknown_tool(self.tool_choice["function"]["name"], names)
