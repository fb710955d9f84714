"""The OpenAI Responses API's request body (`POST /v1/responses`) as a pydantic
model that turns itself into a GenerationRequest: the same chat the chat route
runs, so the same template, tool grammar and structured outputs serve it.

`instructions` is a system message before `input`, whose items become the
chat's messages (responses_input.py). `tools` are Responses' flat function
tools ({"type": "function", "name", "parameters"}), made into the chat's;
`text.format` is the structured output. Nothing is stored and nothing runs in the background:
fields that need a stored response, reasoning, built-in tools or background runs
are refused by name (unhonoured.py's rule), never ignored.
"""

from typing import Annotated, Any

from pydantic import AfterValidator, Field, PlainValidator, model_validator

from .errors import short
from .request import ConstraintRequest, GenerationRequest
from .responses_input import InputItem, chat_messages, input_value
from .structured_options import Schema
from .tool_options import (
    TOOL_CHOICES,
    ignore_tool_choice,
    parallel_calls,
    refuse_unknown_tool,
    tools_and_format,
)
from .tool_results import refuse_unasked_results, responses_calls_and_results
from .unhonoured import RefusesUnhonoured, Unhonoured
from .validation import (
    OptionsObject,
    Refusal,
    RequestModel,
    Unsupported,
    at_least_one,
    expect,
    not_negative,
    number_in,
)

# The chat's names in the package's tool messages -> the Responses API's names.
TOOL_RENAMES = ((".function.parameters", ".parameters"), (".function.name", ".name"))
NOT_STORED = "responses are not stored here: send the whole conversation in input"

UNHONOURED = (
    Unhonoured("previous_response_id", (None,), NOT_STORED),
    Unhonoured("conversation", (None,), NOT_STORED),
    Unhonoured("store", (None, False), f"{NOT_STORED}, with store false or left out"),
    Unhonoured(
        "background", (None, False), "background runs are not supported: stream"
    ),
    Unhonoured(
        "reasoning", (None, {}), "this model does not reason; leave reasoning out"
    ),
    Unhonoured("include", (None, []), "no extra output data is returned"),
    Unhonoured("top_logprobs", (None, 0), "log-probabilities are not returned"),
    Unhonoured(
        "truncation",
        (None, "disabled"),
        "the input is never truncated: a longer one than the context is refused",
    ),
    Unhonoured("prompt", (None,), "stored prompt templates are not supported"),
    Unhonoured("context_management", (None, []), "context compaction is not run"),
    Unhonoured("moderation", (None,), "moderation is not run"),
)


def function_tools(tools) -> list[dict] | None:
    """Responses' flat function tools; built-in tools are refused by name. An
    empty list offers none, as leaving tools out does (the Agents SDK sends []
    for an agent without tools, and OpenAI accepts it)."""
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list):
        raise Refusal(
            'must be a list of {"type": "function", "name": ..., "parameters": '
            "{...}} tools (leave tools out to offer none)"
        )
    for i, tool in enumerate(tools):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function":
            raise Unsupported(
                f"{short(kind)} tools are not run here: offer function tools "
                '{"type": "function", "name": ..., "parameters": {...}}',
                at=f"[{i}]",
            )
    return tools


def tool_choice_value(choice) -> Any:
    if choice is None or choice in TOOL_CHOICES:
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        if not isinstance(choice.get("name"), str):
            raise Refusal('needs a name: {"type": "function", "name": ...}')
        return choice
    raise Refusal(
        'must be "auto", "required", "none" or {"type": "function", "name": ...}: '
        "only function tools run here"
    )


class TextFormat(RequestModel):
    """text.format: {"type": "text"}, {"type": "json_object"} or {"type":
    "json_schema", "name", "schema", "strict"} (held to the schema either way)."""

    type: Annotated[str, expect("a string")] = "text"
    name: Annotated[str | None, expect("a string")] = None
    strict: Annotated[bool | None, expect("true or false")] = None
    schema_: Schema = Field(None, alias="schema")

    @model_validator(mode="after")
    def known(self) -> "TextFormat":
        if self.type not in ("text", "json_object", "json_schema"):
            raise Refusal(
                f'is {short(self.type)}: use "text", "json_object" or "json_schema"',
                field="type",
            )
        if self.type == "json_schema" and self.schema_ is None:
            raise Refusal(
                'is required with "type": "json_schema": the JSON Schema the '
                "answer must follow",
                "missing_required_parameter",
                field="schema",
            )
        return self


def no_other_text_option(value) -> None:
    raise Unsupported("only format (and verbosity medium) is supported")


def medium_verbosity(value: str | None) -> str | None:
    if value not in (None, "medium"):
        raise Unsupported("answer length is set by max_output_tokens")
    return value


class TextOptions(OptionsObject):
    """The body's `text`: its format, and no other option."""

    __pydantic_extra__: dict[str, Annotated[Any, AfterValidator(no_other_text_option)]]

    format: Annotated[
        TextFormat | None, expect('an object like {"type": "json_object"}')
    ] = None
    verbosity: Annotated[
        str | None, expect("a string"), AfterValidator(medium_verbosity)
    ] = None


class ResponsesBody(RefusesUnhonoured):
    """A /v1/responses body."""

    unhonoured = UNHONOURED

    model: Annotated[str | None, expect("a string (see GET /v1/models)")] = None
    input: Annotated[str | list[InputItem], PlainValidator(input_value)] = None
    instructions: Annotated[str | None, expect("a string")] = None
    max_output_tokens: Annotated[
        int | None, expect("an integer"), AfterValidator(at_least_one)
    ] = None
    temperature: Annotated[float, number_in(0.0, 2.0, 1.0)] = None
    top_p: Annotated[float, number_in(0.0, 1.0, 1.0, open_low=True)] = None
    stream: Annotated[bool | None, expect("true or false")] = None
    tools: Annotated[list[dict] | None, PlainValidator(function_tools)] = None
    tool_choice: Annotated[Any, PlainValidator(tool_choice_value)] = None
    parallel_tool_calls: Annotated[bool | None, expect("true or false")] = None
    max_tool_calls: Annotated[
        int | None, expect("an integer"), AfterValidator(not_negative)
    ] = None
    text: Annotated[
        TextOptions | None, expect('an object like {"format": {"type": "text"}}')
    ] = None

    @model_validator(mode="after")
    def consistent(self) -> "ResponsesBody":
        if self.tool_choice is not None and not self.tools:
            ignore_tool_choice("tool_choice", self.tool_choice)
            self.tool_choice = None
        if isinstance(self.tool_choice, dict):
            refuse_unknown_tool(
                self.tool_choice["name"], [tool.get("name") for tool in self.tools]
            )
        self.constraint()  # tools beside a format that is not JSON: refused
        refuse_unasked_results(responses_calls_and_results(self.input))
        return self

    def format_constraint(self) -> ConstraintRequest | None:
        form = self.text.format if self.text else None
        if form is None or form.type == "text":
            return None
        if form.type == "json_object":
            return ConstraintRequest("json_object", None, "text.format")
        return ConstraintRequest("json_schema", form.schema_, "text.format.schema")

    def chat_tools(self) -> list[dict]:
        """The tools in the chat's shape, which the template and grammar take."""
        keys = ("name", "description", "parameters")
        return [
            {"type": "function", "function": {k: t[k] for k in keys if k in t}}
            for t in self.tools
        ]

    def constraint(self) -> ConstraintRequest | None:
        if not self.tools:
            return self.format_constraint()
        choice = self.tool_choice or "auto"
        if isinstance(choice, dict):
            choice = {"type": "function", "function": {"name": choice["name"]}}
        if self.max_tool_calls == 0:
            choice = "none"
        parallel = parallel_calls(self.parallel_tool_calls, choice)
        parallel = parallel and self.max_tool_calls != 1
        value = (self.chat_tools(), choice, parallel)
        formats = [f for f in [self.format_constraint()] if f is not None]
        return tools_and_format(value, formats, TOOL_RENAMES)

    def generation_request(self) -> GenerationRequest:
        offered = self.tools and self.tool_choice != "none" and self.max_tool_calls != 0
        return GenerationRequest(
            "responses",
            self.model,
            messages=chat_messages(self.instructions, self.input),
            tools=self.chat_tools() if offered else None,
            stream=bool(self.stream),
            max_tokens=self.max_output_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            priority="interactive",
            constraint=self.constraint(),
            max_calls=self.max_tool_calls,
        )
