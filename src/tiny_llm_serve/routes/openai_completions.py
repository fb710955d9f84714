"""POST /v1/chat/completions and /v1/completions: OpenAI's generation endpoints.

The body is read and checked by its model (openai_bodies.py, through json_body),
handed to the engine (generation.py), and the answer written as OpenAI's response
object, or, with `stream: true`, as server-sent events of its chunks ending with
`data: [DONE]`.
"""

import logging
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from ..answers import answer_parts, event_stream, whole_answer
from ..errors import ApiError, internal_message
from ..generation import Generation, start_generation
from ..json_body import json_body
from ..openai_bodies import ChatCompletionBody, CompletionBody
from ..openai_objects import (
    call_objects,
    chunk_object,
    new_id,
    response_object,
    sse,
    usage,
)
from ..request import GenerationRequest
from ..state import Server, ServerState

logger = logging.getLogger("tiny_llm_serve")

router = APIRouter()


@router.post("/v1/chat/completions")
async def chat_completions(
    http_request: Request,
    server: Server,
    body: Annotated[ChatCompletionBody, Depends(json_body(ChatCompletionBody))],
) -> Response:
    return await answer(http_request, body.generation_request(), server)


@router.post("/v1/completions")
async def completions(
    http_request: Request,
    server: Server,
    body: Annotated[CompletionBody, Depends(json_body(CompletionBody))],
) -> Response:
    return await answer(http_request, body.generation_request(), server)


async def answer(
    http_request: Request, request: GenerationRequest, server: ServerState
) -> Response:
    generation = await start_generation(http_request, request, server)
    response_id = new_id(request.endpoint)
    model = server.settings.model_name
    if request.stream:
        return event_stream(events(request, generation, response_id, model, server))
    whole = await whole_answer(generation, request, server.constraints.parse_tool_calls)
    ending = whole.ending
    counts = usage(
        generation.prompt_tokens, ending.completion_tokens, ending.cached_tokens
    )
    text = (whole.text or None) if whole.calls else whole.text
    calls = call_objects(whole.calls)
    return JSONResponse(
        response_object(request, response_id, model, text, whole.reason, counts, calls)
    )


async def events(
    request: GenerationRequest,
    generation: Generation,
    response_id: str,
    model: str,
    server: ServerState,
) -> AsyncIterator[str]:
    """Server-sent events in OpenAI's chunk format, ending with `data: [DONE]`.
    With stream_options.include_usage, usage comes once, on a last chunk with no
    choices, as OpenAI sends it. With tools, each call comes whole as a tool-call
    delta and the last chunk's finish_reason is "tool_calls". A failure is an error
    event, then [DONE]."""
    calls_sent = 0
    try:
        if request.endpoint == "chat":
            yield sse(chunk_object(request, response_id, model, "", first=True))
        parts = answer_parts(generation, request, server.constraints.parse_tool_calls)
        async for part in parts:
            if part.text:
                yield sse(chunk_object(request, response_id, model, part.text))
            if part.calls:
                calls = call_objects(part.calls, calls_sent)
                calls_sent += len(calls)
                yield sse(
                    chunk_object(request, response_id, model, "", tool_calls=calls)
                )
            if part.ending is None:
                continue
            end = part.ending
            yield sse(chunk_object(request, response_id, model, "", part.reason))
            if request.include_usage:
                counts = usage(
                    generation.prompt_tokens, end.completion_tokens, end.cached_tokens
                )
                yield sse(chunk_object(request, response_id, model, None, None, counts))
    except ApiError as error:
        yield sse(error.body())
    except Exception as error:  # a bug: the client still gets an ending
        logger.exception("a stream failed")
        yield sse(ApiError(500, internal_message(error), "server_error").body())
    finally:
        generation.close()
    yield "data: [DONE]\n\n"
