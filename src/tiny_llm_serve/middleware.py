"""The app's ASGI middleware: a 500 in the API's error shape for an unexpected
error, and the API key.

Plain ASGI rather than Starlette's BaseHTTPMiddleware, which would re-stream every
server-sent event through a memory channel.
"""

import base64
import binascii
import hmac
import logging

from starlette.requests import ClientDisconnect

from .errors import ApiError, internal_message
from .metrics import ServerMetrics

OPEN_PATHS = ("/health",)  # all else needs the API key when one is set
logger = logging.getLogger("tiny_llm_serve")


class AnswerUnexpectedErrors:
    """An exception no handler turned into a response becomes a 500 in OpenAI's
    shape, logged once, and the connection stays usable (Starlette's own handler
    re-raises it, so uvicorn prints it again and drops the connection). A client
    that hangs up while sending its body ends its request quietly."""

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
            await response.response(scope["path"])(scope, receive, send)


class RequireApiKey:
    """Every path but OPEN_PATHS needs the key, else 401. It comes as
    `Authorization: Bearer KEY` (OpenAI's clients), as `x-api-key: KEY`
    (Anthropic's), or as the password of HTTP Basic authentication: a browser
    opening the chat page asks for it, then sends it with the page's own
    requests."""

    def __init__(self, app, key: str, metrics: ServerMetrics):
        self.app = app
        self.key = key.encode()
        self.metrics = metrics

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        presented = (
            self.presented_key(headers.get(b"authorization", b"")),
            headers.get(b"x-api-key", b""),
        )
        if any(hmac.compare_digest(given, self.key) for given in presented):
            await self.app(scope, receive, send)
            return
        self.metrics.request_rejected.labels("unauthorized").inc()
        headers = None
        if scope["path"] == "/":  # the browser asks for the key
            headers = {"WWW-Authenticate": 'Basic realm="tiny-llm", charset="UTF-8"'}
        response = ApiError(
            401,
            "missing or wrong API key: send the header 'Authorization: Bearer "
            "<key>' (or 'x-api-key: <key>') with the key the server was started "
            "with (--api-key); in a browser, give the key as the password",
            "authentication_error",
            code="invalid_api_key",
            headers=headers,
        ).response(scope["path"])
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
