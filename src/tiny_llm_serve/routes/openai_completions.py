"""POST /v1/chat/completions and /v1/completions: OpenAI's generation endpoints.

The body is read and checked by its model (openai_bodies.py, through json_body),
handed to the engine (generation.py), and the answer written as OpenAI's response
object, or, with `stream: true`, as server-sent events of its chunks ending with
`data: [DONE]`. Each of the request's n choices is written by its own
ChoiceWriter (choice_writer.py: echo, tool calls, logprobs), from the Answers or
Parts that answers.py reads, as the other APIs' routes read theirs.
"""

import logging
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from ..answers import answer_parts, event_stream, whole_answers
from ..choice_writer import ChoiceWriter
from ..errors import ApiError, internal_message
from ..generation import Ending, Generation, start_generation
from ..json_body import json_body
from ..openai_bodies import ChatCompletionBody, CompletionBody
from ..openai_objects import chunk_object, new_id, response_object, sse, usage
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


def total_usage(generation: Generation, endings: list[Ending]) -> dict:
    """The prompt once, the completion tokens of every choice."""
    return usage(
        generation.prompt_tokens,
        sum(e.completion_tokens for e in endings),
        endings[0].cached_tokens,
    )


async def answer(
    http_request: Request, request: GenerationRequest, server: ServerState
) -> Response:
    generation = await start_generation(http_request, request, server)
    response_id = new_id(request.endpoint)
    model = server.settings.model_name
    writers = [ChoiceWriter(request, generation, server, i) for i in range(request.n)]
    if request.stream:
        return event_stream(
            events(request, generation, writers, response_id, model, server)
        )
    parse = server.constraints.parse_tool_calls
    answers = await whole_answers(generation, request, parse)
    choices = [writer.whole(a) for writer, a in zip(writers, answers)]
    counts = total_usage(generation, [a.ending for a in answers])
    return JSONResponse(response_object(request, response_id, model, choices, counts))


async def events(
    request: GenerationRequest,
    generation: Generation,
    writers: list[ChoiceWriter],
    response_id: str,
    model: str,
    server: ServerState,
) -> AsyncIterator[str]:
    """Server-sent events in OpenAI's chunk format, ending with `data: [DONE]`.
    Each chunk carries one choice's index; a chat stream opens every choice with
    its role. With stream_options.include_usage, usage comes once, on a last chunk
    with no choices, as OpenAI sends it; with continuous_usage_stats too (vLLM's),
    every chunk before it carries the prompt's tokens and its choice's completion
    tokens so far. With tools, each call comes whole as a tool-call delta and the
    choice's last chunk's finish_reason is "tool_calls". A failure is an error
    event, then [DONE]."""
    endings: list[Ending | None] = [None] * request.n

    def so_far(index: int) -> dict | None:
        if not request.continuous_usage:
            return None
        return usage(generation.prompt_tokens, generation.completion_tokens(index))

    try:
        if request.endpoint == "chat":
            for i in range(request.n):
                opening = dict(usage_=so_far(i), first=True, index=i)
                yield sse(chunk_object(request, response_id, model, "", **opening))
        parse = server.constraints.parse_tool_calls
        async for part in answer_parts(generation, request, parse):
            endings[part.index] = part.ending or endings[part.index]
            for fields in writers[part.index].streamed(part):
                yield sse(
                    chunk_object(
                        request,
                        response_id,
                        model,
                        usage_=so_far(part.index),
                        index=part.index,
                        **fields,
                    )
                )
        if request.include_usage:
            counts = total_usage(generation, endings)
            yield sse(chunk_object(request, response_id, model, None, None, counts))
    except ApiError as error:
        yield sse(error.body())
    except Exception as error:  # a bug: the client still gets an ending
        logger.exception("a stream failed")
        yield sse(ApiError(500, internal_message(error), "server_error").body())
    finally:
        generation.close()
    yield "data: [DONE]\n\n"
