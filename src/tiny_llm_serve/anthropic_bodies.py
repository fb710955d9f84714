"""Anthropic's Messages API request bodies (`POST /v1/messages` and
`/v1/messages/count_tokens`) as pydantic models that turn themselves into the
chat the chat route runs: the same template, tool grammar and constraints.

`system` and `messages` become the chat's messages (anthropic_content.py). A
last message of the assistant's is a prefill: the model continues its text (the
prompt ends inside that turn) and the answer is the continuation alone.
`tools` ({name, description, input_schema}) become the chat's function tools and `tool_choice` ({"type": "auto" | "any" | "tool" | "none"}) the chat's;
`output_config.format` is a JSON Schema the answer follows. `max_tokens` is
required, as Anthropic requires it, and may run past the context: the answer
then ends where the context does (stop_reason "model_context_window_exceeded").
Fields the server cannot honour (thinking, server tools, images) are refused by
name.
"""

from typing import Annotated, Any

from pydantic import AfterValidator, Field, PlainValidator, model_validator

from .anthropic_content import Message, messages_given, system_text

from .errors import json_type, short
from .request import ConstraintRequest, GenerationRequest
from .structured_options import Schema
from .tool_options import ignore_tool_choice, refuse_unknown_tool, tools_and_format
from .tool_results import messages_calls_and_results, refuse_unasked_results
from .unhonoured import RefusesUnhonoured, Unhonoured
from .validation import (
    OptionsObject,
    Refusal,
    RequestModel,
    Unsupported,
    at_least_one,
    expect,
    number_in,
    required,
    top_k_limit,
    valid_text,
)

MAX_STOP_SEQUENCES = 16
CHOICES = ("auto", "any", "tool", "none")
# The chat's names in the package's tool messages -> the Messages API's names.
TOOL_RENAMES = (
    (".function.parameters", ".input_schema"),
    (".function.name", ".name"),
)

UNHONOURED = (
    Unhonoured(
        "thinking",
        (None, {"type": "disabled"}),
        "this model does not think before answering; leave thinking out",
    ),
    Unhonoured("container", (None,), "no code runs here"),
    Unhonoured("mcp_servers", (None, []), "no MCP servers are called from here"),
    Unhonoured("context_management", (None,), "context editing is not run"),
)


def tool_list(tools) -> list[dict] | None:
    """Custom tools: {name, description, input_schema}; server tools (a type
    other than "custom") are refused by name."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise Refusal(
            f"must be a list of {{name, description, input_schema}} tools, got "
            f"{json_type(tools)}",
            "invalid_type",
        )
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise Refusal("must be a tool {name, input_schema}", at=f"[{i}]")
        if tool.get("type") not in (None, "custom"):
            raise Unsupported(
                f"{short(tool['type'])} is a server tool, and none run here: give "
                "custom tools {name, description, input_schema}",
                at=f"[{i}]",
            )
        if not isinstance(tool.get("input_schema"), dict):
            raise Refusal(
                "needs an input_schema: the JSON Schema of the tool's input",
                "missing_required_parameter",
                at=f"[{i}].input_schema",
            )
    return tools


class ToolChoice(RequestModel):
    """{"type": "auto" | "any" | "tool" | "none"}; "tool" names one tool."""

    type: Annotated[str, expect("a string")] = None
    name: Annotated[str | None, expect("a string")] = None
    disable_parallel_tool_use: Annotated[bool | None, expect("true or false")] = None

    @model_validator(mode="after")
    def known(self) -> "ToolChoice":
        if self.type not in CHOICES:
            raise Refusal(
                f'is {short(self.type)}: use "auto", "any", "tool" or "none"',
                field="type",
            )
        if self.type == "tool" and self.name is None:
            raise Refusal(
                'is required with "type": "tool": the tool to call',
                "missing_required_parameter",
                field="name",
            )
        return self

    def chat_choice(self) -> Any:
        if self.type == "tool":
            return {"type": "function", "function": {"name": self.name}}
        return {"any": "required"}.get(self.type, self.type)


def no_other_output_option(value) -> None:
    raise Unsupported("only format is supported: this model has no effort setting")


class JsonFormat(RequestModel):
    """output_config.format: {"type": "json_schema", "schema": {...}}."""

    type: Annotated[str, expect('"json_schema"')] = None
    schema_: Schema = Field(None, alias="schema")

    @model_validator(mode="after")
    def a_json_schema(self) -> "JsonFormat":
        if self.type != "json_schema":
            raise Refusal(f'is {short(self.type)}: use "json_schema"', field="type")
        if self.schema_ is None:
            raise Refusal(
                "is required: the JSON Schema the answer must follow",
                "missing_required_parameter",
                field="schema",
            )
        return self


class OutputConfig(OptionsObject):
    __pydantic_extra__: dict[
        str, Annotated[Any, AfterValidator(no_other_output_option)]
    ]

    format: Annotated[JsonFormat | None, expect("an object")] = None


class PromptBody(RefusesUnhonoured):
    """What makes the prompt: a count_tokens body, and a messages body's base."""

    unhonoured = UNHONOURED

    model: Annotated[str | None, expect("a string (see GET /v1/models)")] = None
    system: Annotated[str | None, PlainValidator(system_text)] = None
    messages: Annotated[
        list[Annotated[Message, expect("an object with role and content")]],
        expect("a list of {role, content} objects"),
        AfterValidator(messages_given),
        required('a list such as [{"role": "user", "content": "Hi"}]'),
    ] = None
    tools: Annotated[list[dict] | None, PlainValidator(tool_list)] = None
    tool_choice: Annotated[
        ToolChoice | None, expect('an object like {"type": "auto"}')
    ] = None
    output_config: Annotated[
        OutputConfig | None, expect('an object like {"format": {...}}')
    ] = None

    @model_validator(mode="after")
    def tools_consistent(self) -> "PromptBody":
        if self.tool_choice is not None and not self.tools:
            ignore_tool_choice("tool_choice", self.tool_choice.type)
            self.tool_choice = None
        choice = self.tool_choice
        if choice and choice.type == "tool":
            names = [tool.get("name") for tool in self.tools]
            refuse_unknown_tool(choice.name, names, "tool_choice.name", lead="is")
        refuse_unasked_results(messages_calls_and_results(self.messages))
        return self

    @model_validator(mode="after")
    def prefill_continuable(self) -> "PromptBody":
        """A prefill is text the answer can go on from, as Anthropic's API has it:
        not a tool call, not ending in whitespace, and no output schema, which
        the answer would have to follow from its own start."""
        if not self.prefills():
            return self
        where = f"messages[{len(self.messages) - 1}]"
        last = self.messages[-1]
        if any(block.type == "tool_use" for block in last.blocks()):
            raise Refusal(
                "is the assistant's tool_use, which no answer continues: send its "
                "tool_result in a user message after it",
                field=where,
            )
        text = last.chat_messages()[-1].get("content") or ""
        if text != text.rstrip():
            raise Refusal(
                "ends with whitespace: the last message, the assistant's, is "
                "continued as it is written and may not end with whitespace; "
                "remove it",
                field=f"{where}.content",
            )
        if self.format_constraint() is not None:
            raise Refusal(
                "is an assistant prefill, but output_config.format makes the answer "
                "follow the schema from its first token, so none can continue it: "
                "end with a user message, or leave output_config.format out",
                field=where,
            )
        return self

    def prefills(self) -> bool:
        """The last message is the assistant's: a prefill to continue."""
        return self.messages[-1].role == "assistant"

    def chat_tools(self) -> list[dict] | None:
        """The tools offered to the model, in the chat's shape (none under
        tool_choice none, whose grammar still gets them)."""
        if not self.tools or (self.tool_choice and self.tool_choice.type == "none"):
            return None
        return self.function_tools()

    def function_tools(self) -> list[dict]:
        return [
            {
                "type": "function",
                "function": {
                    "name": t.get("name"),
                    **({"description": t["description"]} if "description" in t else {}),
                    "parameters": t["input_schema"],
                },
            }
            for t in self.tools
        ]

    def format_constraint(self) -> ConstraintRequest | None:
        form = self.output_config.format if self.output_config else None
        if form is None:
            return None
        return ConstraintRequest(
            "json_schema", form.schema_, "output_config.format.schema"
        )

    def constraint(self) -> ConstraintRequest | None:
        if not self.tools:
            return self.format_constraint()
        choice = self.tool_choice or ToolChoice(type="auto")
        parallel = not choice.disable_parallel_tool_use
        value = (self.function_tools(), choice.chat_choice(), parallel)
        formats = [f for f in [self.format_constraint()] if f is not None]
        return tools_and_format(value, formats, TOOL_RENAMES)

    def chat_messages(self) -> list[dict]:
        system = [{"role": "system", "content": self.system}] if self.system else []
        return system + [
            m for message in self.messages for m in message.chat_messages()
        ]

    def generation_request(self, **answer) -> GenerationRequest:
        """The request; `answer`: the answer's fields (max_tokens, sampling)."""
        return GenerationRequest(
            "messages",
            self.model,
            messages=self.chat_messages(),
            tools=self.chat_tools(),
            priority="interactive",
            constraint=self.constraint(),
            prefill=self.prefills(),
            **answer,
        )


def stop_sequence_list(stops) -> list[str]:
    if stops is None:
        return []
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise Refusal(
            f"must be a list of strings, got {json_type(stops)}", "invalid_type"
        )
    if len(stops) > MAX_STOP_SEQUENCES:
        raise Refusal(f"has {len(stops)} strings: send at most {MAX_STOP_SEQUENCES}")
    if "" in stops:
        raise Refusal("holds an empty string: every stop sequence needs text")
    return [valid_text(s) for s in stops]


class MessagesBody(PromptBody):
    """A /v1/messages body: the prompt, and the answer's length and sampling."""

    max_tokens: Annotated[
        int,
        expect("an integer"),
        AfterValidator(at_least_one),
        required("the most tokens the answer may have, such as 256"),
    ] = None
    temperature: Annotated[float, number_in(0.0, 1.0, 1.0)] = None
    top_p: Annotated[float, number_in(0.0, 1.0, 1.0, open_low=True)] = None
    top_k: Annotated[int | None, expect("an integer"), AfterValidator(top_k_limit)] = (
        None
    )
    stop_sequences: Annotated[list[str], PlainValidator(stop_sequence_list)] = None
    stream: Annotated[bool | None, expect("true or false")] = None

    @model_validator(mode="after")
    def stops_consistent(self) -> "MessagesBody":
        constraint = self.constraint()
        if self.stop_sequences and constraint is not None and constraint.cuts_whole:
            raise Refusal(
                f"cannot be combined with {constraint.param}: a stop sequence would "
                "cut the answer the constraint promises whole; leave "
                "stop_sequences out",
                field="stop_sequences",
            )
        return self

    def answer_request(self) -> GenerationRequest:
        return self.generation_request(
            stream=bool(self.stream),
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            stop=self.stop_sequences,
            fit_to_context=True,
        )
