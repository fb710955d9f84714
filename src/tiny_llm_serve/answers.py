"""An answer as every API's route reads it: its text, its tool calls and how it
ended, whole or as it comes, for each of a request's choices.

A route starts the generation (generation.py), then reads it here and writes
what it reads in its own API's shape: the chat and completions endpoints (n
choices, their logprobs), the Responses API and the Messages API (one choice)
all read the same Answers or the same Parts, so an answer's calls are found,
checked (tool_answers.CallCheck) and its finish decided in one place.
"""

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from fastapi.responses import StreamingResponse

from tiny_llm_base import TokenLogprob

from .finish import finish_reason
from .generation import Ending, Generation, Part
from .request import GenerationRequest
from .tool_answers import CallCheck, CallSplitter, split_calls


@dataclass
class Answer:
    """A choice's finished answer. text: its content ("" when it has none beside
    its calls); calls: the package's ToolCalls in order (.name, .arguments a dict);
    reason: OpenAI's finish_reason ("tool_calls" when it called and stopped);
    logprobs: its tokens' (empty unless the request asked for them)."""

    text: str
    calls: list
    ending: Ending
    reason: str
    logprobs: list[TokenLogprob] = field(default_factory=list)


async def whole_answers(
    generation: Generation, request: GenerationRequest, parse: Callable
) -> list[Answer]:
    """Every choice's whole answer, in index order (closes the generation).
    parse: the package's parse_tool_calls, used when the request offered tools."""
    texts, entries = [""] * request.n, [[] for _ in range(request.n)]
    endings: list[Ending | None] = [None] * request.n
    try:
        async for part in generation.parts():
            texts[part.index] += part.text
            entries[part.index] += part.logprobs
            endings[part.index] = part.ending or endings[part.index]
    finally:
        generation.close()
    answers = []
    for text, logprobs, ending in zip(texts, entries, endings):
        calls = []
        if request.tools:
            text, calls = split_calls(text, parse)
            CallCheck(request.constraint).check(calls)
            calls = calls[: request.max_calls]
        reason = ending_reason(ending, bool(calls))
        answers.append(Answer(text, calls, ending, reason, logprobs))
    return answers


async def whole_answer(
    generation: Generation, request: GenerationRequest, parse: Callable
) -> Answer:
    """The answer of a one-choice request (whole_answers')."""
    [answer] = await whole_answers(generation, request, parse)
    return answer


async def answer_parts(
    generation: Generation, request: GenerationRequest, parse: Callable
) -> AsyncIterator[Part]:
    """The choices' answers as they come: each choice's Parts with text, calls or
    logprobs, then its last Part. A call's own text is never content. The caller
    closes the generation (in a `finally`: a client may leave mid-stream); a
    failure raises ApiError."""
    splitters = [CallSplitter(parse) for _ in range(request.n)]
    checks = [CallCheck(request.constraint) for _ in range(request.n)]
    called = [False] * request.n
    sent = [0] * request.n  # calls given out
    async for part in generation.parts():
        index, text, end = part.index, part.text, part.ending
        calls = []
        if request.tools:
            text, calls = splitters[index].feed(text)
            text += splitters[index].flush() if end is not None else ""
            checks[index].check(calls)
            if request.max_calls is not None:  # the model's further calls ignored
                calls = calls[: max(0, request.max_calls - sent[index])]
            sent[index] += len(calls)
        called[index] = called[index] or bool(calls)
        if text or calls or part.logprobs:
            yield Part(index, text, calls, part.logprobs)
        if end is not None:
            yield Part(index, ending=end, reason=ending_reason(end, called[index]))


def ending_reason(ending: Ending, called: bool) -> str:
    """The finish_reason of a choice that ended so, having called a tool or not."""
    return finish_reason(ending.engine_reason, ending.stop_string is not None, called)


def event_stream(events: AsyncIterator[str]) -> StreamingResponse:
    """Server-sent events, unbuffered by proxies."""
    return StreamingResponse(
        events,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
