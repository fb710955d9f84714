"""An answer's tool calls in OpenAI's shapes: message.tool_calls in a whole
response, tool-call deltas in a stream.

The calls are read out of the answer's text by the package's parse_tool_calls (week
4 day 2); under the tool-call grammar every call parses. A stream holds back text
from an opening tag until its call is complete, so a client never sees a call's raw
text as content, and sends each call whole, as one delta.
"""

import json
import uuid
from collections.abc import Callable

from tiny_llm_base.tool_prompts import CLOSE, OPEN


def call_objects(calls: list, first_index: int = 0) -> list[dict]:
    """Parsed calls (name, arguments) -> OpenAI's tool_calls entries: an id, type
    "function", the name and the arguments as JSON text (and, in a stream, the
    call's index)."""
    return [
        {
            "index": first_index + i,
            "id": f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {"name": call.name, "arguments": json.dumps(call.arguments)},
        }
        for i, call in enumerate(calls)
    ]


def whole_message(text: str, parse: Callable) -> tuple[str | None, list[dict]]:
    """A finished answer -> (content, None when there is none; tool_calls). A call
    the answer opened but never closed (cut at max_tokens) is not content."""
    content, calls = parse(text)
    objects = [
        {k: v for k, v in call.items() if k != "index"} for call in call_objects(calls)
    ]
    if not objects:
        return text, []
    return content.partition(OPEN)[0].strip() or None, objects


def finish_reason(reason: str, called: bool) -> str:
    """OpenAI's "tool_calls" when the model called and then stopped by itself; an
    answer cut at max_tokens stays "length"."""
    return "tool_calls" if called and reason == "stop" else reason


class CallSplitter:
    """Feeds a streamed answer's pieces; gives back the text that is surely content
    and the calls completed, holding back a possible call until it closes."""

    def __init__(self, parse: Callable):
        self.parse = parse
        self.buffer = ""
        self.calls = 0

    def feed(self, piece: str) -> tuple[str, list[dict]]:
        self.buffer += piece
        text, calls = "", []
        while (start := self.buffer.find(OPEN)) >= 0:
            end = self.buffer.find(CLOSE, start)
            if end < 0:
                break
            text += self.buffer[:start]
            block = self.buffer[start : end + len(CLOSE)]
            _, found = self.parse(block)
            if found:
                calls += call_objects(found, self.calls + len(calls))
            else:
                text += block
            self.buffer = self.buffer[end + len(CLOSE) :]
        if OPEN not in self.buffer:
            held = max(
                (n for n in range(1, len(OPEN)) if self.buffer.endswith(OPEN[:n])),
                default=0,
            )
            text += self.buffer[: len(self.buffer) - held]
            self.buffer = self.buffer[len(self.buffer) - held :]
        self.calls += len(calls)
        if self.calls and not text.strip():
            text = ""  # the newlines between calls
        return text, calls

    def flush(self) -> str:
        """The text held back when the answer ended: a call it opened but never
        closed (cut at max_tokens) is not content."""
        rest, self.buffer = self.buffer.partition(OPEN)[0], ""
        return "" if self.calls and not rest.strip() else rest
