"""The OpenAI-compatible HTTP server: FastAPI handlers over the engine thread.

A generation request goes: read the body (bounded), check it (protocol.py), refuse
it when too many wait (503), tokenize and hand it to the engine on a worker thread
(tokenizing never runs on the event loop), then read its Stream: as server-sent
events (`stream: true`) or whole. A watcher aborts the request when the client
disconnects, so its slot is free after the engine's next step.
"""

import asyncio
import base64
import binascii
import hmac
import json
import logging
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from tiny_llm_base import (
    JsonObject,
    JsonSchema,
    PromptSpec,
    SchedulerSnapshot,
    UnsatisfiableConstraint,
)
from tiny_llm_base.prompts import chat_token_ids

from .engine_loop import EngineFailure, EngineLoop, Stream, finish_reason
from .errors import ApiError, invalid
from .metrics import ServerMetrics
from .protocol import (
    ConstraintRequest,
    GenerationRequest,
    short,
    chunk_object,
    new_id,
    parse_chat,
    parse_completion,
    response_object,
    usage,
)

CHAT_PAGE = Path(__file__).with_name("chat.html")
OPEN_PATHS = ("/health",)  # all else needs the API key when one is set
logger = logging.getLogger("tiny_llm_serve")


@dataclass
class ServerSettings:
    """model_name: the one model id served (GET /v1/models); a request naming
    another gets 404. api_key: None, or the key every request but /health must
    send as `Authorization: Bearer KEY` (or as the password of HTTP Basic
    authentication, which is how a browser opens the chat page); without one,
    /engine shows no request text. max_waiting: requests handed to the engine
    without a token yet beyond which new ones get 503 with Retry-After
    (retry_after_s). max_body_bytes: larger bodies get 413. body_timeout_s: a
    body not all there by then gets 408 and its connection is closed."""

    model_name: str
    api_key: str | None = None
    max_waiting: int = 64
    retry_after_s: int = 1
    max_body_bytes: int = 1 << 20
    body_timeout_s: float = 10.0


def create_app(
    engine,
    settings: ServerSettings,
    make_sampler: Callable,
    on_step: Callable[[SchedulerSnapshot], None] | None = None,
) -> FastAPI:
    """The app serving `engine` (either package's Engine). make_sampler(temp, top_p,
    top_k): the package's, for requests with temperature > 0 (greedy ones use the
    engine's default sampler). on_step(snapshot): called on the engine thread after
    every step. The engine thread starts and stops with the app."""
    metrics = ServerMetrics()
    loop = EngineLoop(engine, metrics, on_step)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        loop.start()
        yield
        loop.stop()

    app = FastAPI(title="tiny-llm", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.engine_loop = loop
    app.state.metrics = metrics
    app.state.admitting = 0  # requests between the busy check and submit
    started = int(time.time())

    @app.exception_handler(ApiError)
    async def api_error(request: Request, error: ApiError) -> JSONResponse:
        if error.kind == "server_busy":
            metrics.request_rejected.labels("busy").inc()
        elif error.status < 500:
            metrics.request_rejected.labels("bad_request").inc()
        return error.response()

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, error: HTTPException) -> JSONResponse:
        kind = (
            "not_found_error" if error.status_code == 404 else "invalid_request_error"
        )
        message = {
            404: f"no endpoint {request.url.path}: see /v1/chat/completions, "
            "/v1/completions, /v1/models, /health, /metrics",
            405: f"{request.method} is not allowed on {request.url.path}",
        }.get(error.status_code, str(error.detail))
        return ApiError(error.status_code, message, kind).response()

    if settings.api_key:
        app.add_middleware(RequireApiKey, key=settings.api_key, metrics=metrics)
    app.add_middleware(AnswerUnexpectedErrors)  # outermost: sees every error

    def get(path: str):
        """A GET route that answers HEAD too, with the same headers and no body."""
        return app.api_route(path, methods=["GET", "HEAD"])

    @get("/")
    async def chat_page() -> HTMLResponse:
        return HTMLResponse(CHAT_PAGE.read_text(encoding="utf-8"))

    @get("/health")
    async def health() -> JSONResponse:
        if loop.failure is not None:
            return JSONResponse({"status": "failed", "error": loop.failure}, 503)
        return JSONResponse({"status": "ok"})

    @get("/metrics")
    async def prometheus() -> Response:
        return Response(
            generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST
        )

    @get("/engine")
    async def engine_status() -> JSONResponse:
        # Without a key anyone who can connect reads this: positions, no text.
        return JSONResponse(loop.status(show_text=settings.api_key is not None))

    def model_object() -> dict:
        return {
            "id": settings.model_name,
            "object": "model",
            "created": started,
            "owned_by": "tiny-llm",
            "max_model_len": engine.config.max_seq_len,
        }

    @get("/v1/models")
    async def models() -> JSONResponse:
        return JSONResponse({"object": "list", "data": [model_object()]})

    @get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> JSONResponse:
        if model_id != settings.model_name:
            raise ApiError(
                404,
                f"the model {short(model_id)} is not served here: this server has "
                f"{settings.model_name!r} only (GET /v1/models lists it)",
                "not_found_error",
                param="model",
                code="model_not_found",
            )
        return JSONResponse(model_object())

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await generate(request, parse_chat(await read_json(request)))

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await generate(request, parse_completion(await read_json(request)))

    async def read_json(request: Request):
        """The body as JSON, refused unless sent as application/json (415), past
        max_body_bytes (413), when it does not arrive within body_timeout_s (408,
        and the connection closes) or when it is malformed or nested too deep."""
        given = request.headers.get("content-type", "")
        if given.partition(";")[0].strip().lower() != "application/json":
            # A web page can POST text/plain to any address without asking the
            # browser first (no CORS preflight): only JSON starts a generation.
            raise ApiError(
                415,
                f"the body must be sent with 'Content-Type: application/json', got "
                f"{short(given) if given else 'none'}: send the JSON with that header",
                code="unsupported_media_type",
            )
        limit = settings.max_body_bytes
        too_large = ApiError(
            413,
            f"the request body is larger than {limit:,} bytes (prompt, messages, "
            "schema and every other field together): send a smaller request",
            code="request_too_large",
        )
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise too_large
        body = bytearray()
        try:
            async with asyncio.timeout(settings.body_timeout_s):
                async for piece in request.stream():
                    body += piece
                    if len(body) > limit:
                        raise too_large
        except TimeoutError:
            raise ApiError(
                408,
                f"the request body did not arrive within {settings.body_timeout_s:g} "
                f"s ({len(body)} of {declared or 'an unknown number of'} bytes came): "
                "send the whole body, with a Content-Length that matches it",
                code="request_timeout",
                headers={"Connection": "close"},
            ) from None
        try:
            return json.loads(body)
        except (ValueError, UnicodeDecodeError) as error:
            why = str(error)
            if why.startswith("Exceeds the limit"):  # Python's guard on int parsing
                why = f"a number has more than {sys.get_int_max_str_digits()} digits"
            raise invalid(
                f"the body is not valid JSON ({why}): send a JSON object",
                None,
                code="invalid_json",
            ) from None
        except RecursionError:
            raise invalid(
                "the body's JSON is nested too deeply to read: send a flat object "
                "as the API describes",
                None,
                code="invalid_json",
            ) from None

    async def generate(http_request: Request, request: GenerationRequest) -> Response:
        if request.model not in (None, settings.model_name):
            raise ApiError(
                404,
                f"the model {request.model!r} is not served here: use "
                f"{settings.model_name!r} (GET /v1/models lists it)",
                param="model",
                code="model_not_found",
            )
        if loop.failure is not None:
            raise ApiError(503, f"{loop.failure}; restart the server", "server_error")
        if loop.waiting + app.state.admitting >= settings.max_waiting:
            raise ApiError(
                503,
                f"the server is busy: {settings.max_waiting} requests are waiting "
                f"for the engine; retry after {settings.retry_after_s} s",
                "server_busy",
                code="server_busy",
                headers={"Retry-After": str(settings.retry_after_s)},
            )
        stream = Stream(asyncio.get_running_loop(), request.stop)
        app.state.admitting += 1
        try:
            prompt_tokens = await run_in_threadpool(submit, request, stream)
        finally:
            app.state.admitting -= 1
        watcher = asyncio.create_task(abort_on_disconnect(http_request, stream))
        response_id = new_id(request.endpoint)
        if request.stream:
            events = stream_events(request, stream, watcher, response_id, prompt_tokens)
            return StreamingResponse(
                events,
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        text, ending = "", None
        try:
            async for piece, end in answer(stream):
                text += piece
                ending = end
        finally:
            watcher.cancel()
            if ending is None:  # cancelled or failed before the engine finished it
                loop.abort(stream.request_id)
        return JSONResponse(
            response_object(
                request,
                response_id,
                settings.model_name,
                text,
                ending.reason,
                usage(prompt_tokens, ending.completion_tokens, ending.cached_tokens),
            )
        )

    def submit(request: GenerationRequest, stream: Stream) -> int:
        """On a worker thread: the prompt's token ids, checked against the context,
        handed to the engine; returns the prompt's length."""
        ids = prompt_ids(engine, request)
        limit = engine.config.max_seq_len
        if request.max_tokens is None and len(ids) >= limit:
            raise context_error(
                request,
                f"the prompt has {len(ids)} tokens, and this server's context is "
                f"{limit} tokens: shorten the prompt",
            )
        if request.max_tokens is not None and len(ids) + request.max_tokens > limit:
            raise context_error(
                request,
                f"the prompt has {len(ids)} tokens and max_tokens is "
                f"{short(request.max_tokens)}: "
                f"{short(len(ids) + request.max_tokens)} tokens, more "
                f"than this server's context of {limit} tokens; shorten the prompt or "
                "lower max_tokens",
            )
        sampler = None
        if not request.is_greedy:
            try:
                sampler = make_sampler(
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
            max_tokens=request.max_tokens or limit - len(ids),
            sampler=sampler,
            priority=request.priority,
            constraint=checked_constraint(engine, request.constraint),
        )
        stream.constraint_param = request.constraint and request.constraint.param
        loop.submit(spec, stream)
        return len(ids)

    async def answer(stream: Stream) -> AsyncIterator[tuple[str, Ending | None]]:
        """(text, None) for each piece of the answer, then ("", Ending). A failed
        request raises ApiError (500; 503 when the server is stopping)."""
        stops = stream.stops
        received = 0  # tokens up to the one that completed a stop string
        while True:
            output = await stream.queue.get()
            if isinstance(output, EngineFailure):
                raise ApiError(output.status, output.message, "server_error")
            if not stream.stopped_by_string:
                received += len(output.tokens)
            text = output.text
            if output.finish_reason in ("length", "max_seq_len"):
                # Cut inside a character: its first bytes alone decode to U+FFFD.
                text = text.rstrip("\ufffd")
            piece = stops.feed(text)
            if stops.stopped and not stream.stopped_by_string:
                stream.stopped_by_string = True
                loop.abort(stream.request_id)
            if output.finish_reason is not None:
                piece += stops.flush()
            if piece:
                yield piece, None
            if output.finish_reason is None:
                continue
            if output.finish_reason == "error":
                raise generation_error(output.result, stream.constraint_param)
            reason = finish_reason(output.finish_reason, stream.stopped_by_string)
            result = output.result
            tokens = received if stream.stopped_by_string else len(result.tokens)
            yield "", Ending(reason, tokens, result.cached_tokens)
            return

    async def stream_events(
        request: GenerationRequest,
        stream: Stream,
        watcher: asyncio.Task,
        response_id: str,
        prompt_tokens: int,
    ) -> AsyncIterator[str]:
        """Server-sent events in OpenAI's chunk format, ending with `data: [DONE]`.
        With stream_options.include_usage, usage comes once, on a last chunk with no
        choices, as OpenAI sends it. A failure is an error event, then [DONE]."""
        model = settings.model_name
        finished = False
        try:
            if request.endpoint == "chat":
                yield sse(chunk_object(request, response_id, model, "", first=True))
            async for piece, end in answer(stream):
                if end is None:
                    yield sse(chunk_object(request, response_id, model, piece))
                    continue
                finished = True
                yield sse(chunk_object(request, response_id, model, "", end.reason))
                if request.include_usage:
                    counts = usage(
                        prompt_tokens, end.completion_tokens, end.cached_tokens
                    )
                    yield sse(
                        chunk_object(request, response_id, model, None, None, counts)
                    )
        except ApiError as error:
            finished = True
            yield sse(error.body())
        except Exception as error:  # a bug: the client still gets an ending
            logger.exception("a stream failed")
            yield sse(ApiError(500, internal_message(error), "server_error").body())
        finally:
            watcher.cancel()
            if not finished:  # the client went away, or the stream failed
                loop.abort(stream.request_id)
        yield "data: [DONE]\n\n"

    async def abort_on_disconnect(http_request: Request, stream: Stream) -> None:
        while True:
            message = await http_request.receive()
            if message["type"] == "http.disconnect":
                loop.abort(stream.request_id)
                return

    return app


@dataclass
class Ending:
    """How a request ended: OpenAI's finish_reason, the tokens its client got (up
    to the one that completed a stop string) and those its prompt found cached."""

    reason: str
    completion_tokens: int
    cached_tokens: int


class AnswerUnexpectedErrors:
    """ASGI middleware: an exception no handler turned into a response becomes a
    500 in OpenAI's shape, logged once, and the connection stays usable (Starlette's
    own handler re-raises it, so uvicorn prints it again and drops the connection).
    A client that hangs up while sending its body ends its request quietly."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        started = False

        async def tracked_send(message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked_send)
        except ClientDisconnect:
            return
        except Exception as error:
            if started or scope["type"] != "http":
                raise
            logger.exception("%s %s failed", scope["method"], scope["path"])
            response = ApiError(500, internal_message(error), "server_error")
            await response.response()(scope, receive, send)


class RequireApiKey:
    """ASGI middleware: every path but OPEN_PATHS needs the key, else 401. It comes
    as `Authorization: Bearer KEY`, or as the password of HTTP Basic
    authentication: a browser opening the chat page asks for it, then sends it
    with the page's own requests. (Plain ASGI rather than BaseHTTPMiddleware,
    which would re-stream every SSE chunk through a memory channel.)"""

    def __init__(self, app, key: str, metrics: ServerMetrics):
        self.app = app
        self.key = key.encode()
        self.metrics = metrics

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        given = dict(scope["headers"]).get(b"authorization", b"")
        if hmac.compare_digest(self.presented_key(given), self.key):
            await self.app(scope, receive, send)
            return
        self.metrics.request_rejected.labels("unauthorized").inc()
        headers = None
        if scope["path"] == "/":  # the browser asks for the key
            headers = {"WWW-Authenticate": 'Basic realm="tiny-llm", charset="UTF-8"'}
        response = ApiError(
            401,
            "missing or wrong API key: send the header 'Authorization: Bearer "
            "<key>' with the key the server was started with (--api-key); in a "
            "browser, give the key as the password",
            "authentication_error",
            code="invalid_api_key",
            headers=headers,
        ).response()
        await response(scope, receive, send)

    @staticmethod
    def presented_key(header: bytes) -> bytes:
        scheme, _, credentials = header.partition(b" ")
        if scheme.lower() == b"bearer":
            return credentials
        if scheme.lower() == b"basic":
            try:
                pair = base64.b64decode(credentials, validate=True)
            except (binascii.Error, ValueError):
                return b""
            return pair.partition(b":")[2]  # any user name; the key is the password
        return b""


def prompt_ids(engine, request: GenerationRequest) -> list[int]:
    """Chat: the messages through the model's chat template, the assistant's turn
    opened. Completion: the text tokenized as it is, or the ids as given."""
    tokenizer = engine.tokenizer
    if request.messages is not None:
        try:
            ids = chat_token_ids(tokenizer, request.messages)
        except Exception as error:  # the template's own checks (jinja raises)
            raise invalid(
                f"the model's chat template refused these messages: {error}",
                "messages",
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


def checked_constraint(engine, constraint: ConstraintRequest | None):
    """The engine's package's constraint for a request's structured-output option,
    started once against the tokenizer so that a bad one is a 400 here, not a
    failed answer: a schema with an unsupported keyword or nothing it can match, a
    regex that does not parse or matches nothing, a choice no token can spell."""
    if constraint is None:
        return None
    inner = getattr(engine, "engine", engine)  # a wrapper's (RankZeroEngine's) engine
    package = sys.modules[type(inner).__module__.partition(".")[0]]
    if constraint.kind == "json_schema":
        try:
            made = JsonSchema(constraint.value)
        except ValueError as error:
            raise invalid(str(error), constraint.param) from None
    elif constraint.kind == "json_object":
        made = JsonObject()
    elif constraint.kind == "regex":
        made = package.Regex(constraint.value)
    else:
        made = package.Choice(constraint.value)
    try:
        package.start_constraint(made, engine.tokenizer, engine.model.vocab_size)
    except (TypeError, ValueError) as error:
        raise invalid(str(error), constraint.param) from None
    except NotImplementedError as error:
        raise ApiError(
            501,
            f"structured outputs are not written yet ({error}): leave "
            f"{constraint.param} out",
            param=constraint.param,
            code="not_implemented",
        ) from None
    return made


def generation_error(result, constraint_param: str | None) -> ApiError:
    """A request the engine failed: the client's constraint when it could not go on
    (a 400 naming its field), else the server's fault (500)."""
    marker = f"{UnsatisfiableConstraint.__name__}: "
    if constraint_param and marker in result.error:
        reason = result.error.partition(marker)[2]
        return invalid(
            f"{constraint_param} cannot be met: after {len(result.tokens)} tokens of "
            f"answer, {reason}",
            constraint_param,
        )
    return ApiError(500, f"generation failed: {result.error}", "server_error")


def context_error(request: GenerationRequest, message: str) -> ApiError:
    param = "messages" if request.endpoint == "chat" else "prompt"
    return invalid(message, param, code="context_length_exceeded")


def internal_message(error: Exception) -> str:
    return f"internal error: {type(error).__name__}: {error}"


def sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"
