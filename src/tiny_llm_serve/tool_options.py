"""The chat body's tool fields (OpenAI's function calling): `tools`, `tool_choice`,
`parallel_tool_calls`, and the messages that carry earlier calls and their results.

The tools' schemas are checked where the grammar is made (the package's
tool_constraint, through the constraint factory), so a schema the structured-output
library cannot compile is a 400 naming `tools`; here only the shapes are checked.
"""

import logging
from typing import Annotated, Any

from pydantic import PlainValidator

from .errors import short
from .request import ConstraintRequest
from .validation import Refusal, RequestModel, expect

logger = logging.getLogger("tiny_llm_serve")
TOOL_CHOICES = ("auto", "required", "none")
JSON_FORMATS = ("json_schema", "json_object")


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


def ignore_tool_choice(field: str, choice) -> None:
    """Log a tool_choice given without tools, which the server ignores."""
    logger.warning(
        "%s %s given without tools: answered without it", field, short(choice)
    )


def tools_and_format(
    value: tuple, formats: list[ConstraintRequest], renames: tuple = ()
) -> ConstraintRequest:
    """The tools' constraint (value: the chat's tools, tool_choice,
    parallel_tool_calls) with the body's structured-output options `formats`: at
    most one, a JSON format, which an answer without calls follows (OpenAI takes
    both: the model calls a tool or answers in the format)."""
    if len(formats) > 1 or (formats and formats[0].kind not in JSON_FORMATS):
        extra = formats[-1] if len(formats) > 1 else formats[0]
        raise Refusal(
            "cannot be combined with tools: beside tools, give at most one JSON "
            "format (response_format json_schema or json_object), which an answer "
            "without calls follows",
            field=extra.param,
        )
    answer_format = formats[0] if formats else None
    return ConstraintRequest("tools", value, "tools", renames, answer_format)


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
        """A tool_choice without tools is answered as if it were not there, as
        OpenAI's API answers it (llama-index sends "required" without tools); a
        named one must name a tool given."""
        if self.tool_choice is not None and not self.tools:
            ignore_tool_choice("tool_choice", self.tool_choice)
            self.tool_choice = None
        if isinstance(self.tool_choice, dict) and self.tools:
            names = [(t.get("function") or {}).get("name") for t in self.tools]
            refuse_unknown_tool(self.tool_choice["function"]["name"], names)
