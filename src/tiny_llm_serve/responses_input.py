"""The `input` of a Responses API body, as pydantic models that become the chat's
messages.

`input` is a string (one user message) or a list of items: messages (role user,
assistant, system or developer; text, or input_text/output_text parts) and a
tool round trip's function_call items (the model's calls, as an earlier
response gave them) and function_call_output items (their results), which
become an assistant message's tool_calls and tool messages. Items that refer to
stored state (item_reference) or that this model cannot read (images, files,
reasoning) are refused by name.
"""

import json
from typing import Annotated

from pydantic import AfterValidator, PlainValidator, TypeAdapter, model_validator

from .errors import json_type, short
from .validation import Refusal, RequestModel, Unsupported, expect, valid_text

ROLES = ("user", "assistant", "system", "developer")
TEXT_PARTS = ("input_text", "output_text")
ITEM_KINDS = ("message", "function_call", "function_call_output")


def content_text(content) -> str:
    """A message's (or a call output's) text: a string, or text parts joined."""
    if isinstance(content, str):
        return valid_text(content)
    if not isinstance(content, list):
        raise Refusal(
            f'must be a string or a list of {{"type": "input_text", "text": "..."}} '
            f"parts, got {json_type(content)}",
            "invalid_type",
        )
    texts = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        text = part.get("text") if isinstance(part, dict) else None
        if kind not in TEXT_PARTS or not isinstance(text, str):
            raise Refusal(
                'must be a text part {"type": "input_text", "text": "..."}: '
                "this model reads text only",
                at=f"[{i}]",
            )
        texts.append(valid_text(text))
    return "".join(texts)


def optional_text(content) -> str | None:
    return None if content is None else content_text(content)


def item_kind(kind) -> str:
    """An input item's type; a bare {role, content} is a message."""
    if kind is None:
        return "message"
    if kind not in ITEM_KINDS:
        raise Unsupported(
            f"{short(kind)} items are not supported: send messages, function_call "
            "and function_call_output items (nothing is stored to refer to)"
        )
    return kind


def item_role(role) -> str | None:
    if role is not None and role not in ROLES:
        raise Refusal(f"is {short(role)}: use one of {', '.join(ROLES)}")
    return "system" if role == "developer" else role


def json_arguments(arguments: str | None) -> str | None:
    if arguments is None:
        return None
    try:
        decoded = json.loads(arguments)
    except json.JSONDecodeError:
        decoded = None
    if not isinstance(decoded, dict):
        raise Refusal(f"must be a JSON object as text, got {short(arguments)}")
    return arguments


class InputItem(RequestModel):
    """One item of `input`. A message has role and content; a function_call
    (the model's call, as an earlier response gave it) call_id, name and
    arguments; a function_call_output call_id and output. Other fields (id,
    status) are read past."""

    type: Annotated[str, PlainValidator(item_kind)] = None
    role: Annotated[str | None, PlainValidator(item_role)] = None
    content: Annotated[str | None, PlainValidator(optional_text)] = None
    call_id: Annotated[str | None, expect("a string")] = None
    name: Annotated[str | None, expect("a string")] = None
    arguments: Annotated[
        str | None, expect("a string of JSON"), AfterValidator(json_arguments)
    ] = None
    output: Annotated[str | None, PlainValidator(optional_text)] = None

    @model_validator(mode="after")
    def complete(self) -> "InputItem":
        needs = {
            "message": ("role", "content"),
            "function_call": ("call_id", "name", "arguments"),
            "function_call_output": ("call_id", "output"),
        }[self.type]
        for name in needs:
            if getattr(self, name) is None:
                raise Refusal(
                    f"is required in a {self.type} item",
                    "missing_required_parameter",
                    field=name,
                )
        return self


INPUT_ITEMS = TypeAdapter(
    list[Annotated[InputItem, expect('an item such as {"role": "user", ...}')]]
)


def input_value(value) -> str | list[InputItem]:
    """input: a string (one user message) or a non-empty list of items."""
    if value is None:
        raise Refusal(
            'is required: a string, or items such as [{"role": "user", "content": '
            '"Hi"}]',
            "missing_required_parameter",
        )
    if value == "" or value == []:
        raise Refusal('is empty: send text, or items such as {"role": "user", ...}')
    if isinstance(value, str):
        return valid_text(value)
    if isinstance(value, list):
        return INPUT_ITEMS.validate_python(value)
    raise Refusal(
        f"must be a string or a list of input items, got {json_type(value)}",
        "invalid_type",
    )


def chat_messages(instructions: str | None, items: str | list[InputItem]) -> list[dict]:
    """instructions and input as chat messages: a function_call joins the
    assistant message just before it (its text, or earlier calls)."""
    messages = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    if isinstance(items, str):
        return messages + [{"role": "user", "content": items}]
    for item in items:
        if item.type == "message":
            messages.append({"role": item.role, "content": item.content})
        elif item.type == "function_call_output":
            messages.append(
                {"role": "tool", "tool_call_id": item.call_id, "content": item.output}
            )
        else:
            call = {
                "id": item.call_id,
                "type": "function",
                "function": {"name": item.name, "arguments": item.arguments},
            }
            last = messages[-1] if messages else {}
            if last.get("role") == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "tool_calls": [call]})
    return messages
