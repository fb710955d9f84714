"""The objects the OpenAI generation routes answer with: whole responses, stream
chunks (server-sent events) and usage, as OpenAI's API documents them. Each choice
carries its index; `logprobs` is null unless the request asked for them
(logprobs.py writes them)."""

import json
import time
import uuid

from .request import GenerationRequest


def call_objects(calls: list, first_index: int | None = None) -> list[dict]:
    """Parsed calls (name, arguments) -> OpenAI's tool_calls entries: an id, type
    "function", the name and the arguments as JSON text, and, in a stream
    (first_index given), the call's index."""
    return [
        {
            **({} if first_index is None else {"index": first_index + i}),
            "id": f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {"name": call.name, "arguments": json.dumps(call.arguments)},
        }
        for i, call in enumerate(calls)
    ]


def new_id(endpoint: str) -> str:
    prefix = "chatcmpl" if endpoint == "chat" else "cmpl"
    return f"{prefix}-{uuid.uuid4().hex}"


def usage(
    prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None
) -> dict:
    """completion_tokens: every choice's, summed (a stream's running usage: the
    chunk's choice's so far, with no cached_tokens: known once it ends)."""
    counts = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    if cached_tokens is not None:
        counts["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return counts


def choice_object(
    request: GenerationRequest,
    index: int,
    text: str | None,
    finish_reason: str,
    tool_calls: list[dict] | None = None,
    logprobs: dict | None = None,
) -> dict:
    """One choice of a whole (non-streamed) answer; with tool_calls, the chat
    message carries them (text may then be None)."""
    if request.endpoint == "chat":
        message = {"role": "assistant", "content": text}
        if tool_calls:
            message["tool_calls"] = tool_calls
        return {
            "index": index,
            "message": message,
            "logprobs": logprobs,
            "finish_reason": finish_reason,
        }
    return {
        "index": index,
        "text": text,
        "logprobs": logprobs,
        "finish_reason": finish_reason,
    }


def response_object(
    request: GenerationRequest,
    response_id: str,
    model: str,
    choices: list[dict],
    usage_: dict,
) -> dict:
    """The whole (non-streamed) answer: choice_object's, in index order."""
    return {
        "id": response_id,
        "object": "chat.completion"
        if request.endpoint == "chat"
        else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": usage_,
    }


def chunk_object(
    request: GenerationRequest,
    response_id: str,
    model: str,
    text: str | None,
    finish_reason: str | None = None,
    usage_: dict | None = None,
    first: bool = False,
    tool_calls: list[dict] | None = None,
    index: int = 0,
    logprobs: dict | None = None,
) -> dict:
    """One streamed chunk of choice `index`. text None: a chunk with no choices
    (the usage chunk). tool_calls: whole calls as deltas (each with its index), no
    content."""
    if text is None:
        choices = []
    elif request.endpoint == "chat":
        delta = {"role": "assistant", "content": text} if first else {"content": text}
        if finish_reason is not None and not text:
            delta = {}
        if tool_calls:
            delta = {"tool_calls": tool_calls}
        choices = [
            {
                "index": index,
                "delta": delta,
                "logprobs": logprobs,
                "finish_reason": finish_reason,
            }
        ]
    else:
        choices = [
            {
                "index": index,
                "text": text,
                "logprobs": logprobs,
                "finish_reason": finish_reason,
            }
        ]
    chunk = {
        "id": response_id,
        "object": "chat.completion.chunk"
        if request.endpoint == "chat"
        else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
    }
    if usage_ is not None:
        chunk["usage"] = usage_
    return chunk


def sse(payload: dict) -> str:
    """One server-sent event carrying `payload` as compact JSON."""
    return f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"
