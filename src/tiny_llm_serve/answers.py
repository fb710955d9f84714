"""An answer as every API's route reads it: its text, its tool calls and how it
ended, whole or as it comes.

A route starts the generation (generation.py), then reads it here and writes
what it reads in its own API's shape: the chat and completions endpoints,
the Responses API and the Messages API all read the same Answer or the same
Parts, so an answer's calls are found and its finish decided in one place.
"""

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from fastapi.responses import StreamingResponse

from .generation import Ending, Generation
from .request import GenerationRequest
from .tool_answers import CallSplitter, finish_reason, split_calls


@dataclass
class Answer:
    """A finished answer. text: its content ("" when it has none beside its
    calls); calls: the package's ToolCalls in order (.name, .arguments a dict);
    reason: OpenAI's finish_reason ("tool_calls" when it called and stopped)."""

    text: str
    calls: list
    ending: Ending
    reason: str


@dataclass
class Part:
    """A piece of a streamed answer: text that is surely content, the calls
    completed with it, and, on the last Part only, the ending and the
    finish_reason (as Answer's)."""

    text: str = ""
    calls: list = field(default_factory=list)
    ending: Ending | None = None
    reason: str | None = None


async def whole_answer(
    generation: Generation, request: GenerationRequest, parse: Callable
) -> Answer:
    """The whole answer (closes the generation). parse: the package's
    parse_tool_calls, used when the request offered tools."""
    text, ending = "", None
    try:
        async for piece, end in generation.pieces():
            text += piece
            ending = end
    finally:
        generation.close()
    calls = []
    if request.tools:
        text, calls = split_calls(text, parse)
    return Answer(text, calls, ending, finish_reason(ending.reason, bool(calls)))


async def answer_parts(
    generation: Generation, request: GenerationRequest, parse: Callable
) -> AsyncIterator[Part]:
    """The answer as it comes: Parts with text or calls, then the last Part. A
    call's own text is never content. The caller closes the generation (in a
    `finally`: a client may leave mid-stream); a failure raises ApiError."""
    splitter = CallSplitter(parse)
    called = False
    async for piece, end in generation.pieces():
        calls = []
        if request.tools:
            piece, calls = splitter.feed(piece)
            piece += splitter.flush() if end is not None else ""
        called = called or bool(calls)
        if piece or calls:
            yield Part(piece, calls)
        if end is not None:
            yield Part(ending=end, reason=finish_reason(end.reason, called))


def event_stream(events: AsyncIterator[str]) -> StreamingResponse:
    """Server-sent events, unbuffered by proxies."""
    return StreamingResponse(
        events,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
