"""Anthropic's Messages API objects: the message (content blocks, stop_reason,
usage) and the stream's events.

A stream is `event: TYPE` / `data: {"type": TYPE, ...}` pairs: message_start
(the message with no content), a ping, then per content block
content_block_start, content_block_delta (text_delta pieces, or a call's whole
input as one input_json_delta) and content_block_stop, then message_delta (the
stop_reason and the final usage) and message_stop.
"""

import json
import uuid

from .answers import Answer
from .generation import Ending
from .request import GenerationRequest


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def usage(prompt_tokens: int, output_tokens: int, cached_tokens: int) -> dict:
    """Anthropic counts the prompt's tokens read from the cache apart from the
    rest: input_tokens + cache_read_input_tokens is the whole prompt."""
    return {
        "input_tokens": prompt_tokens - cached_tokens,
        "cache_read_input_tokens": cached_tokens,
        "cache_creation_input_tokens": 0,
        "output_tokens": output_tokens,
    }


def stop_reason(reason: str, ending: Ending, request: GenerationRequest) -> str:
    """The stop_reason of an answer that ended with OpenAI's finish_reason
    `reason`: tool_use, stop_sequence, max_tokens, the context's end (the answer
    ran out of room before max_tokens: see fit_to_context), or end_turn."""
    if reason == "tool_calls":
        return "tool_use"
    if ending.stop_string is not None:
        return "stop_sequence"
    if reason == "length":
        if ending.completion_tokens < request.max_tokens:
            return "model_context_window_exceeded"
        return "max_tokens"
    return "end_turn"


def tool_use_block(call) -> dict:
    """A tool_use block for a parsed call (.name, .arguments)."""
    return {
        "type": "tool_use",
        "id": new_id("toolu"),
        "name": call.name,
        "input": call.arguments,
    }


def message_object(
    message_id: str,
    model: str,
    content: list[dict],
    stop: str | None,
    stop_sequence: str | None,
    usage_: dict,
) -> dict:
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop,
        "stop_sequence": stop_sequence,
        "usage": usage_,
    }


def content_blocks(answer: Answer) -> list[dict]:
    """A whole answer's content: its text (if any), then its calls."""
    text = [{"type": "text", "text": answer.text}] if answer.text else []
    return text + [tool_use_block(call) for call in answer.calls]


def event(kind: str, **fields) -> str:
    data = json.dumps(
        {"type": kind, **fields}, ensure_ascii=False, separators=(",", ":")
    )
    return f"event: {kind}\ndata: {data}\n\n"


class StreamedContent:
    """The content block events for an answer's parts, the blocks numbered in
    order. Each method returns the events to send."""

    def __init__(self):
        self.blocks = 0  # blocks started
        self.text_open = False

    def text(self, delta: str) -> list[str]:
        events = []
        if not self.text_open:
            events.append(self.start({"type": "text", "text": ""}))
            self.text_open = True
        delta_ = {"type": "text_delta", "text": delta}
        return events + [
            event("content_block_delta", index=self.blocks - 1, delta=delta_)
        ]

    def calls(self, calls: list) -> list[str]:
        events = self.close_text()
        for call in calls:
            block = tool_use_block(call)
            events.append(self.start({**block, "input": {}}))
            partial = {
                "type": "input_json_delta",
                "partial_json": json.dumps(call.arguments),
            }
            events.append(
                event("content_block_delta", index=self.blocks - 1, delta=partial)
            )
            events.append(event("content_block_stop", index=self.blocks - 1))
        return events

    def start(self, block: dict) -> str:
        self.blocks += 1
        return event("content_block_start", index=self.blocks - 1, content_block=block)

    def close_text(self) -> list[str]:
        if not self.text_open:
            return []
        self.text_open = False
        return [event("content_block_stop", index=self.blocks - 1)]
