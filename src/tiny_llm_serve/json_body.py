"""A POST's JSON body, read within limits and checked as its API's body model.

`json_body(Model)` is the FastAPI dependency a route declares its body with:

    body: Annotated[ChatCompletionBody, Depends(json_body(ChatCompletionBody))]

It reads the body itself (FastAPI's own reading has no size or time limit, and
would answer in its own error shape), then validates it (validation.py): every
refusal is an ApiError in OpenAI's shape.
"""

import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from typing import TypeVar

from fastapi import Request

from .errors import ApiError, invalid, short
from .state import ServerSettings, server_state
from .validation import RequestModel, validated

Body = TypeVar("Body", bound=RequestModel)


def json_body(model: type[Body]) -> Callable[[Request], Awaitable[Body]]:
    """The dependency giving a request's body as `model`."""

    async def read(request: Request) -> Body:
        return validated(
            model, await read_json(request, server_state(request).settings)
        )

    return read


async def read_json(request: Request, settings: ServerSettings):
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
