"""POST /v1/messages and /v1/messages/count_tokens: Anthropic's Messages API over
the same engine as the chat.

The body (anthropic_bodies.py) becomes the chat the chat route would run; the
answer (answers.py) is written as Anthropic's message, or, with `stream: true`,
as its events (anthropic_objects.py). Errors under /v1/messages are in
Anthropic's shape (errors.py); a failure mid-stream is an `error` event. The
anthropic-version header is accepted whatever it says, and the API key may come
as x-api-key (middleware.py).
"""

import logging
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from ..answers import answer_parts, event_stream, whole_answer
from ..anthropic_bodies import MessagesBody, PromptBody
from ..anthropic_objects import (
    StreamedContent,
    content_blocks,
    event,
    message_object,
    new_id,
    stop_reason,
    usage,
)
from ..errors import ApiError, internal_message
from ..generation import Generation, check_model, prompt_ids, start_generation
from ..json_body import json_body
from ..request import GenerationRequest
from ..state import Server, ServerState

logger = logging.getLogger("tiny_llm_serve")

router = APIRouter()


@router.post("/v1/messages")
async def messages(
    http_request: Request,
    server: Server,
    body: Annotated[MessagesBody, Depends(json_body(MessagesBody))],
) -> Response:
    request = body.answer_request()
    generation = await start_generation(http_request, request, server)
    message_id = new_id("msg")
    if request.stream:
        return event_stream(events(request, generation, message_id, server))
    answer = await whole_answer(
        generation, request, server.constraints.parse_tool_calls
    )
    ending = answer.ending
    counts = usage(
        generation.prompt_tokens, ending.completion_tokens, ending.cached_tokens
    )
    stop = stop_reason(answer.reason, ending, request)
    model = server.settings.model_name
    content = content_blocks(answer)
    return JSONResponse(
        message_object(message_id, model, content, stop, ending.stop_string, counts)
    )


@router.post("/v1/messages/count_tokens")
async def count_tokens(
    server: Server,
    body: Annotated[PromptBody, Depends(json_body(PromptBody))],
) -> JSONResponse:
    """The prompt's tokens as /v1/messages would build them (template, tools)."""
    request = body.generation_request()
    check_model(request, server)
    ids = await run_in_threadpool(prompt_ids, server.engine, request)
    return JSONResponse({"input_tokens": len(ids)})


async def events(
    request: GenerationRequest,
    generation: Generation,
    message_id: str,
    server: ServerState,
) -> AsyncIterator[str]:
    """The message as Anthropic's events (anthropic_objects.py). A failure is an
    `error` event, the stream's last."""
    model = server.settings.model_name
    content = StreamedContent()
    try:
        opened = usage(generation.prompt_tokens, 0, 0)
        start = message_object(message_id, model, [], None, None, opened)
        yield event("message_start", message=start)
        yield event("ping")
        parse = server.constraints.parse_tool_calls
        async for part in answer_parts(generation, request, parse):
            events = content.text(part.text) if part.text else []
            events += content.calls(part.calls) if part.calls else []
            if part.ending is not None:
                end = part.ending
                events += content.close_text()
                stop = stop_reason(part.reason, end, request)
                delta = {"stop_reason": stop, "stop_sequence": end.stop_string}
                counts = usage(
                    generation.prompt_tokens, end.completion_tokens, end.cached_tokens
                )
                events.append(event("message_delta", delta=delta, usage=counts))
                events.append(event("message_stop"))
            for each in events:
                yield each
    except ApiError as error:
        yield event("error", error=error.anthropic_body()["error"])
    except Exception as error:  # a bug: the client still gets an ending
        logger.exception("a stream failed")
        failure = ApiError(500, internal_message(error), "server_error")
        yield event("error", error=failure.anthropic_body()["error"])
    finally:
        generation.close()
