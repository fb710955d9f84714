"""The Responses API's objects: the response, its output items (an assistant
message with one output_text part, and a function_call item per call), usage,
and the stream's events.

A stream is the same response told in events, each `event: TYPE` and `data:
{..., "sequence_number": n}`: response.created and response.in_progress (the
response with no output yet); per message, output_item.added,
content_part.added, output_text.delta per piece, output_text.done,
content_part.done, output_item.done; per call, output_item.added,
function_call_arguments.delta and .done, output_item.done; then
response.completed (or response.incomplete) with the whole response.
"""

import json
import time
import uuid

from .answers import Answer
from .responses_bodies import ResponsesBody


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def usage(prompt_tokens: int, output_tokens: int, cached_tokens: int) -> dict:
    return {
        "input_tokens": prompt_tokens,
        "input_tokens_details": {"cached_tokens": cached_tokens},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt_tokens + output_tokens,
    }


def status_of(reason: str) -> str:
    """ "incomplete" for an answer cut at max_output_tokens (or the context)."""
    return "incomplete" if reason == "length" else "completed"


def output_text(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def message_item(item_id: str, text: str | None, status: str) -> dict:
    """The assistant's message; text None: just opened, with no part yet."""
    content = [] if text is None else [output_text(text)]
    return {
        "type": "message",
        "id": item_id,
        "status": status,
        "role": "assistant",
        "content": content,
    }


def call_item(call, arguments: str | None = None) -> dict:
    """A function_call item for a parsed call (.name, .arguments); arguments ""
    while its stream has not yet sent them."""
    done = arguments is None
    return {
        "type": "function_call",
        "id": new_id("fc"),
        "call_id": f"call_{uuid.uuid4().hex[:24]}",
        "name": call.name,
        "arguments": json.dumps(call.arguments) if done else arguments,
        "status": "completed" if done else "in_progress",
    }


def output_items(answer: Answer) -> list[dict]:
    """A whole answer's output: its message (unless it only called), its calls."""
    items = []
    if answer.text or not answer.calls:
        status = "completed" if answer.calls else status_of(answer.reason)
        items.append(message_item(new_id("msg"), answer.text, status))
    return items + [call_item(call) for call in answer.calls]


class ResponseObject:
    """The response being written: its id and time, and the request's settings
    it echoes, as the API's response object does."""

    def __init__(self, body: ResponsesBody, model: str):
        self.id = new_id("resp")
        self.created_at = int(time.time())
        self.body = body
        self.model = model

    def object(
        self, status: str, output: list[dict] = (), usage_: dict | None = None
    ) -> dict:
        body = self.body
        form = body.text.format if body.text else None
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": None,
            "incomplete_details": incomplete,
            "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens,
            "model": self.model,
            "output": list(output),
            "parallel_tool_calls": body.parallel_tool_calls is not False,
            "previous_response_id": None,
            "reasoning": None,
            "store": False,
            "background": False,
            "temperature": body.temperature,
            "top_p": body.top_p,
            "text": {
                "format": form.model_dump(by_alias=True, exclude_none=True)
                if form
                else {"type": "text"}
            },
            "tool_choice": body.tool_choice or "auto",
            "tools": body.tools or [],
            "truncation": "disabled",
            "usage": usage_,
            "metadata": {},
        }


class StreamedOutput:
    """The stream's events for an answer's parts, numbered in order; `output`
    holds the items finished so far. Each method returns the events to send."""

    def __init__(self, response: ResponseObject):
        self.response = response
        self.sequence = 0
        self.output: list[dict] = []
        self.message: dict | None = None  # the open message item

    def event(self, kind: str, **fields) -> str:
        payload = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        data = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
        return f"event: {kind}\ndata: {data}\n\n"

    def start(self) -> list[str]:
        opened = self.response.object("in_progress")
        return [
            self.event("response.created", response=opened),
            self.event("response.in_progress", response=opened),
        ]

    def text(self, delta: str) -> list[str]:
        events = [] if self.message else self.open_message()
        self.message["content"][0]["text"] += delta
        place = self.place(self.message)
        return events + [
            self.event("response.output_text.delta", **place, delta=delta, logprobs=[])
        ]

    def calls(self, calls: list) -> list[str]:
        events = self.close_message("completed")
        for call in calls:
            item = call_item(call, arguments="")
            arguments = json.dumps(call.arguments)
            index = len(self.output)
            at = {"item_id": item["id"], "output_index": index}
            events.append(
                self.event("response.output_item.added", output_index=index, item=item)
            )
            events.append(
                self.event(
                    "response.function_call_arguments.delta", **at, delta=arguments
                )
            )
            events.append(
                self.event(
                    "response.function_call_arguments.done", **at, arguments=arguments
                )
            )
            item = {**item, "arguments": arguments, "status": "completed"}
            self.output.append(item)
            events.append(
                self.event("response.output_item.done", output_index=index, item=item)
            )
        return events

    def finish(self, reason: str, usage_: dict) -> list[str]:
        """The last events: the open message closed (an answer with no text and
        no call still has its empty message, as a whole response does), then the
        response with its status."""
        status = status_of(reason)
        events = [] if self.output or self.message else self.open_message()
        events += self.close_message(status)
        whole = self.response.object(status, self.output, usage_)
        return events + [self.event(f"response.{status}", response=whole)]

    def open_message(self) -> list[str]:
        self.message = message_item(new_id("msg"), None, "in_progress")
        index = len(self.output)
        events = [
            self.event(
                "response.output_item.added", output_index=index, item=self.message
            )
        ]
        self.message = {**self.message, "content": [output_text("")]}
        return events + [
            self.event(
                "response.content_part.added",
                **self.place(self.message),
                part=output_text(""),
            )
        ]

    def close_message(self, status: str) -> list[str]:
        if self.message is None:
            return []
        message, self.message = self.message, None
        text = message["content"][0]["text"]
        place = self.place(message)
        item = {**message, "status": status}
        self.output.append(item)
        return [
            self.event("response.output_text.done", **place, text=text, logprobs=[]),
            self.event("response.content_part.done", **place, part=output_text(text)),
            self.event(
                "response.output_item.done",
                output_index=place["output_index"],
                item=item,
            ),
        ]

    def place(self, message: dict) -> dict:
        """Where a text event belongs: the open message is the next output item."""
        return {
            "item_id": message["id"],
            "output_index": len(self.output),
            "content_index": 0,
        }
