"""POST /v1/responses: OpenAI's Responses API over the same engine as the chat.

The body (responses_bodies.py) becomes the chat the chat route would run; the
answer (answers.py) is written as a response object, or, with `stream: true`,
as the Responses API's events (responses_objects.py). Errors are OpenAI's error
object, the Responses API's too; a failure mid-stream is an `error` event.
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
from ..request import GenerationRequest
from ..responses_bodies import ResponsesBody
from ..responses_objects import (
    ResponseObject,
    StreamedOutput,
    output_items,
    status_of,
    usage,
)
from ..state import Server, ServerState

logger = logging.getLogger("tiny_llm_serve")

router = APIRouter()


@router.post("/v1/responses")
async def responses(
    http_request: Request,
    server: Server,
    body: Annotated[ResponsesBody, Depends(json_body(ResponsesBody))],
) -> Response:
    request = body.generation_request()
    generation = await start_generation(http_request, request, server)
    response = ResponseObject(body, server.settings.model_name)
    if request.stream:
        return event_stream(events(request, generation, response, server))
    answer = await whole_answer(
        generation, request, server.constraints.parse_tool_calls
    )
    ending = answer.ending
    counts = usage(
        generation.prompt_tokens, ending.completion_tokens, ending.cached_tokens
    )
    status = status_of(answer.reason)
    return JSONResponse(response.object(status, output_items(answer), counts))


async def events(
    request: GenerationRequest,
    generation: Generation,
    response: ResponseObject,
    server: ServerState,
) -> AsyncIterator[str]:
    """The response as the Responses API's events (responses_objects.py). A
    failure is an `error` event, the stream's last."""
    out = StreamedOutput(response)
    try:
        for event in out.start():
            yield event
        parse = server.constraints.parse_tool_calls
        async for part in answer_parts(generation, request, parse):
            events = out.text(part.text) if part.text else []
            events += out.calls(part.calls) if part.calls else []
            if part.ending is not None:
                end = part.ending
                counts = usage(
                    generation.prompt_tokens, end.completion_tokens, end.cached_tokens
                )
                events += out.finish(part.reason, counts)
            for event in events:
                yield event
    except ApiError as error:
        yield error_event(out, error)
    except Exception as error:  # a bug: the client still gets an ending
        logger.exception("a stream failed")
        yield error_event(out, ApiError(500, internal_message(error), "server_error"))
    finally:
        generation.close()


def error_event(out: StreamedOutput, error: ApiError) -> str:
    return out.event(
        "error", code=error.code or error.kind, message=error.message, param=error.param
    )
