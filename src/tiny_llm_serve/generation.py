"""A checked request on the engine: admitted, handed over, and its answer read.

`start_generation` refuses a request naming another model, or arriving while the
engine has failed or too many wait (503); then, on a worker thread (tokenizing
never runs on the event loop), it builds the prompt's token ids, checks them
against the context, makes the sampler, the constraint and the sampling options,
and hands the request to the engine. The Generation it returns yields the pieces
of its n choices' answers as they come; a watcher aborts the request when the
client disconnects, so its slots are free after the engine's next step. Nothing
here knows an API's response format: each route module writes the pieces in its
own (routes/), through answers.py.

max_tokens 0 (a prompt scored, with echo) asks the engine for one token, whose
text and logprob are not the client's: the choice ends with "length" and no
completion tokens, its prompt's logprobs computed by the prefill.

The engine's streaming detokenizer drops the space an answer starts with (a chat
answer reads "Hello", not " Hello"). Where the answer continues text the client
holds (the prompt echoed, an assistant prefill continued) that space is put
back, so the two read as the tokenizer decodes them together: "The sky is" +
" blue".
"""

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from fastapi import Request
from starlette.concurrency import run_in_threadpool

from tiny_llm_base import PromptSpec, TokenLogprob
from tiny_llm_base.tool_prompts import tool_chat_token_ids

from .constraints import checked_constraint, generation_error
from .streams import EngineFailure, Stream
from .errors import ApiError, invalid, short
from .logprobs import token_texts
from .request import GenerationRequest
from .state import ServerState


@dataclass
class Ending:
    """How a choice ended: the engine's finish reason ("stop", "length",
    "max_seq_len", "abort", "error"), the tokens its client got (up to the one that
    completed a stop string), those its prompt found cached, and the stop string
    that ended it (None when none did). finish.finish_reason turns it into the
    API's finish_reason."""

    engine_reason: str
    completion_tokens: int
    cached_tokens: int
    stop_string: str | None = None


@dataclass
class Part:
    """A piece of choice `index`'s answer, the one record every API's writer reads:
    text that is surely content, the tool calls completed with it (answers.py
    splits them out), the logprobs of the tokens it came with (when asked; those
    past a stop string are dropped with their text), and, on the choice's last
    Part only, its Ending and OpenAI's finish_reason (set by answers.py)."""

    index: int
    text: str = ""
    calls: list = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    ending: Ending | None = None
    reason: str | None = None


class Generation:
    """One request handed to the engine. parts() yields each choice's Parts (text
    and logprobs; no calls, no finish_reason yet), its last one with its Ending; a failed choice raises ApiError (500; 503 when the
    server is stopping; 400 for a constraint stuck mid-answer). prompt_ids: the
    prompt's token ids; prompt_logprobs: theirs (None first), once the prefill has
    given them (echo with logprobs); completion_tokens(i): choice i's so far.
    close() must follow: it stops the disconnect watcher and aborts the request
    unless the engine is done with it. keeps_first_space: the answer continues
    the client's text, so the space the detokenizer drops from its start is put
    back (see the module's docstring)."""

    def __init__(
        self,
        server: ServerState,
        stream: Stream,
        prompt_ids: list[int],
        watcher,
        scores_only: bool = False,
        keeps_first_space: bool = False,
    ):
        self.server = server
        self.stream = stream
        self.prompt_ids = prompt_ids
        self.prompt_tokens = len(prompt_ids)
        self.prompt_logprobs: list[TokenLogprob | None] | None = None
        self.watcher = watcher
        self.scores_only = scores_only  # max_tokens 0: the engine's token is dropped
        self.keeps_first_space = keeps_first_space
        self.done = False  # the engine finished or failed the request
        # Each choice's tokens so far, up to the one that completed a stop string.
        self.received = [0] * stream.n

    def completion_tokens(self, index: int) -> int:
        """Choice `index`'s tokens its client has got so far: its Ending's
        completion_tokens once it has ended."""
        return 0 if self.scores_only else self.received[index]

    async def parts(self) -> AsyncIterator[Part]:
        stream, loop = self.stream, self.server.loop
        received = self.received
        left = stream.n
        # Each choice's tokens until its first text, while its first space is due.
        texts = token_texts(self.server.engine.tokenizer)
        leading = [[] if self.keeps_first_space else None for _ in range(stream.n)]
        while left:
            output = await stream.queue.get()
            if isinstance(output, EngineFailure):
                self.done = True
                raise ApiError(output.status, output.message, "server_error")
            index, stops = output.index, stream.stops[output.index]
            if output.prompt_logprobs is not None:
                self.prompt_logprobs = output.prompt_logprobs
            logprobs = []
            if not stream.stopped_by_string[index]:
                received[index] += len(output.tokens)
                logprobs = output.logprobs
            text = output.text
            if output.finish_reason in ("length", "max_seq_len"):
                # Cut inside a character: its first bytes alone decode to U+FFFD.
                text = text.rstrip("\ufffd")
            if leading[index] is not None:
                leading[index] += output.tokens
                if text:
                    if texts.spells_first_space(leading[index]):
                        text = " " + text
                    leading[index] = None
            piece = stops.feed(text)
            if stops.stopped and not stream.stopped_by_string[index]:
                stream.stopped_by_string[index] = True
                loop.abort(stream.request_id, index)
            if output.finish_reason is not None:
                piece += stops.flush()
            if self.scores_only:
                piece, logprobs = "", []
            if piece or logprobs:
                yield Part(index, piece, logprobs=logprobs)
            if output.finish_reason is None:
                continue
            left -= 1
            self.done = not left
            if output.finish_reason == "error":
                raise generation_error(output.result, stream.constraint_param)
            stopped = stream.stopped_by_string[index]
            reason, result = output.finish_reason, output.result
            tokens = received[index] if stopped else len(result.tokens)
            found = stops.found if stopped else None
            if self.scores_only:
                reason, tokens = "length", 0
            yield Part(
                index, ending=Ending(reason, tokens, result.cached_tokens, found)
            )

    def close(self) -> None:
        self.watcher.cancel()
        if not self.done:  # the client went away, or the answer failed on our side
            self.server.loop.abort(self.stream.request_id)


async def start_generation(
    http_request: Request, request: GenerationRequest, server: ServerState
) -> Generation:
    """Admit `request` and hand it to the engine (see the module's docstring)."""
    settings, loop = server.settings, server.loop
    check_model(request, server)
    if loop.failure is not None:
        raise ApiError(503, f"{loop.failure}; restart the server", "server_error")
    if loop.waiting + server.admitting >= settings.max_waiting:
        raise ApiError(
            503,
            f"the server is busy: {settings.max_waiting} requests are waiting "
            f"for the engine; retry after {settings.retry_after_s} s",
            "server_busy",
            code="server_busy",
            headers={"Retry-After": str(settings.retry_after_s)},
        )
    stream = Stream(
        asyncio.get_running_loop(), request.stop, request.n, bool(request.tools)
    )
    server.admitting += 1
    try:
        ids = await run_in_threadpool(submit, server, request, stream)
    finally:
        server.admitting -= 1
    watcher = asyncio.create_task(abort_on_disconnect(http_request, server, stream))
    keeps_first_space = request.echo or request.prefill
    return Generation(
        server, stream, ids, watcher, request.max_tokens == 0, keeps_first_space
    )


def check_model(request: GenerationRequest, server: ServerState) -> None:
    """A 404 for a request naming a model this server does not have."""
    name = server.settings.model_name
    if request.model not in (None, name):
        raise ApiError(
            404,
            f"the model {request.model!r} is not served here: use {name!r} "
            "(GET /v1/models lists it)",
            param="model",
            code="model_not_found",
        )


def submit(
    server: ServerState, request: GenerationRequest, stream: Stream
) -> list[int]:
    """On a worker thread: the prompt's token ids, checked against the context,
    handed to the engine with its options; returns the ids."""
    engine = server.engine
    ids = prompt_ids(engine, request)
    limit = engine.config.max_seq_len
    room = limit - len(ids)  # what the context leaves for the answer
    # max_tokens 0: the engine still samples one token (dropped), which needs room
    asked = None if request.max_tokens is None else max(request.max_tokens, 1)
    if room <= 0 and (asked is None or request.fit_to_context):
        raise context_error(
            request,
            f"the prompt has {len(ids)} tokens, and this server's context is "
            f"{limit} tokens: shorten the prompt",
        )
    if asked is not None and asked > room and not request.fit_to_context:
        raise context_error(
            request,
            f"the prompt has {len(ids)} tokens and {request.limit_param} is "
            f"{short(request.max_tokens)}: {short(len(ids) + asked)} tokens, more "
            f"than this server's context of {limit} tokens; shorten the prompt or "
            f"lower {request.limit_param}",
        )
    options = request.options
    if options is not None:
        try:
            options.check(engine.model.vocab_size)
        except (TypeError, ValueError) as error:  # logit_bias: ids past the vocabulary
            raise invalid(str(error), str(error).split()[0]) from None
    sampler = None
    if not request.is_greedy:
        try:
            sampler = server.make_sampler(
                request.temperature, request.top_p, request.top_k
            )
        except NotImplementedError as error:
            raise ApiError(
                501,
                f"sampling with temperature > 0 is not written yet ({error}): "
                "send temperature 0 for greedy answers",
                param="temperature",
                code="not_implemented",
            ) from None
    spec = PromptSpec(
        ids,
        max_tokens=min(asked or room, room),
        sampler=sampler,
        priority=request.priority,
        constraint=checked_constraint(engine, server.constraints, request.constraint),
        options=options,
        n=request.n,
    )
    stream.constraint_param = request.constraint and request.constraint.param
    server.loop.submit(spec, stream)
    return ids


def prompt_ids(engine, request: GenerationRequest) -> list[int]:
    """Chat: the messages through the model's chat template, the assistant's turn
    opened (with a prefill: the last message, the assistant's, left open).
    Completion: the text tokenized as it is, or the ids as given."""
    tokenizer = engine.tokenizer
    if request.messages is not None:
        try:
            ids = tool_chat_token_ids(
                tokenizer, request.messages, request.tools, request.prefill
            )
        except Exception as error:  # the template's own checks (jinja raises)
            raise invalid(
                f"the model's chat template refused these messages: {error}",
                request.prompt_param,
            ) from None
        return list(ids)
    if isinstance(request.prompt, str):
        ids = tokenizer.encode(request.prompt)
        if not ids:
            raise invalid("prompt has no tokens: give text to continue", "prompt")
        return list(ids)
    vocab = engine.model.vocab_size
    for position, token in enumerate(request.prompt):
        if token >= vocab:
            raise invalid(
                f"prompt[{position}] is {short(token)}, outside the model's vocabulary "
                f"[0, {vocab}): send ids the model's tokenizer made",
                "prompt",
            )
    return request.prompt


def context_error(request: GenerationRequest, message: str) -> ApiError:
    return invalid(message, request.prompt_param, code="context_length_exceeded")


async def abort_on_disconnect(
    http_request: Request, server: ServerState, stream: Stream
) -> None:
    while True:
        message = await http_request.receive()
        if message["type"] == "http.disconnect":
            server.loop.abort(stream.request_id)
            return
