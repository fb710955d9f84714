"""The conversation of an Anthropic Messages API body, as pydantic models that
become the chat's messages.

`system` is a string or text blocks. Each message has a role (user or
assistant; system, which newer clients send, with text only) and content: a
string, or blocks. Text blocks are its text; an
assistant's tool_use blocks (id, name, input) are its calls, the chat's
tool_calls; a user's tool_result blocks (tool_use_id, content, is_error) each
become a tool message before the user's text. Images and documents are refused:
this model reads text.
"""

import json
from typing import Annotated

from pydantic import PlainValidator, TypeAdapter, model_validator

from .errors import json_type, short
from .validation import (
    Refusal,
    RequestModel,
    Text,
    Unsupported,
    expect,
    required,
    valid_text,
)

BLOCK_KINDS = ("text", "tool_use", "tool_result")


def block_kind(kind) -> str:
    if kind not in BLOCK_KINDS:
        raise Unsupported(
            f"{short(kind)} blocks are not supported: this model reads text, and "
            "tool_use and tool_result blocks"
        )
    return kind


def blocks_text(content, what: str) -> str:
    """Text blocks joined: `what` the content is (for the message)."""
    if isinstance(content, str):
        return valid_text(content)
    if not isinstance(content, list):
        raise Refusal(
            f"must be a string or a list of text blocks, got {json_type(content)}",
            "invalid_type",
        )
    texts = []
    for i, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        text = block.get("text") if isinstance(block, dict) else None
        if kind != "text" or not isinstance(text, str):
            raise Refusal(
                f'must be a text block {{"type": "text", "text": "..."}}: {what} is '
                "text only here",
                at=f"[{i}]",
            )
        texts.append(valid_text(text))
    return "".join(texts)


def system_text(system) -> str | None:
    return None if system is None else blocks_text(system, "the system prompt")


def result_text(content) -> str:
    return "" if content is None else blocks_text(content, "a tool result")


class Block(RequestModel):
    """One content block: text (text), tool_use (id, name, input: an
    assistant's call), or tool_result (tool_use_id, content, is_error)."""

    type: Annotated[str, PlainValidator(block_kind)] = None
    text: Annotated[Text | None, expect("a string")] = None
    id: Annotated[str | None, expect("a string")] = None
    name: Annotated[str | None, expect("a string")] = None
    input: Annotated[dict | None, expect("an object")] = None
    tool_use_id: Annotated[str | None, expect("a string")] = None
    content: Annotated[str, PlainValidator(result_text)] = None
    is_error: Annotated[bool | None, expect("true or false")] = None

    @model_validator(mode="after")
    def complete(self) -> "Block":
        needs = {
            "text": ("text",),
            "tool_use": ("id", "name", "input"),
            "tool_result": ("tool_use_id",),
        }[self.type]
        for name in needs:
            if getattr(self, name) is None:
                raise Refusal(
                    f"is required in a {self.type} block",
                    "missing_required_parameter",
                    field=name,
                )
        return self


BLOCKS = TypeAdapter(list[Annotated[Block, expect("a content block (an object)")]])


def message_content(content) -> str | list[Block]:
    if isinstance(content, str):
        return valid_text(content)
    if content == []:
        raise Refusal('is empty: send text, or blocks such as [{"type": "text", ...}]')
    if isinstance(content, list):
        return BLOCKS.validate_python(content)
    raise Refusal(
        f"must be a string or a list of content blocks, got {json_type(content)}",
        "invalid_type",
    )


def known_role(role) -> str:
    if role not in ("user", "assistant", "system"):
        raise Refusal(f"is {short(role)}: use user or assistant (or system)")
    return role


class Message(RequestModel):
    """One message: its role and its content, a string or blocks."""

    role: Annotated[str, PlainValidator(known_role)] = None
    content: Annotated[
        str | list[Block],
        PlainValidator(message_content),
        required('a string, or blocks such as [{"type": "text", "text": "Hi"}]'),
    ] = None

    @model_validator(mode="after")
    def blocks_in_their_turn(self) -> "Message":
        allowed = {"user": ("text", "tool_result"), "assistant": ("text", "tool_use")}
        for i, block in enumerate(self.blocks()):
            if block.type not in allowed.get(self.role, ("text",)):
                raise Refusal(
                    f"cannot be in a {self.role} message: tool_use blocks are the "
                    "assistant's, tool_result blocks the user's",
                    field=f"content[{i}]",
                )
        return self

    def blocks(self) -> list[Block]:
        return [] if isinstance(self.content, str) else self.content

    def chat_messages(self) -> list[dict]:
        """This message as chat messages: a user's tool results come first, one
        tool message each, then its text; an assistant's calls are tool_calls."""
        if isinstance(self.content, str):
            return [{"role": self.role, "content": self.content}]
        text = "".join(b.text for b in self.content if b.type == "text")
        out = [
            {
                "role": "tool",
                "tool_call_id": b.tool_use_id,
                "content": f"Error: {b.content}" if b.is_error else b.content,
            }
            for b in self.content
            if b.type == "tool_result"
        ]
        calls = [
            {
                "id": b.id,
                "type": "function",
                "function": {"name": b.name, "arguments": json.dumps(b.input)},
            }
            for b in self.content
            if b.type == "tool_use"
        ]
        if calls:
            said = {"content": text} if text else {}
            out.append({"role": "assistant", **said, "tool_calls": calls})
        elif text or not out:
            out.append({"role": self.role, "content": text})
        return out


def messages_given(messages: list[Message]) -> list[Message]:
    if not messages:
        raise Refusal(
            'is empty: send at least one message, such as {"role": "user", '
            '"content": "Hi"}'
        )
    return messages
