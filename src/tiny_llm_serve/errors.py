"""Errors in the shape of the API a client called: OpenAI's `{"error":
{"message", "type", "param", "code"}}` (the chat, completions and Responses
endpoints and all others), and Anthropic's `{"type": "error", "error": {"type",
"message"}}` under /v1/messages.

Every refusal the server makes is an ApiError with a 4xx (or 503) status and a
message that says what to fix; the app turns it into that body. Nothing a client
sends may become a 500 or a stack trace. `short` and `json_type` write a client's
value into such a message the way the client wrote it.
"""

from fastapi import Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException


class ApiError(Exception):
    """A request the server refuses: HTTP `status`, and the error object's fields.

    kind: OpenAI's `type` ("invalid_request_error", "authentication_error",
    "not_found_error", "server_busy", "server_error"). param: the request field at
    fault, or None. code: a short machine-readable reason, or None.
    """

    def __init__(
        self,
        status: int,
        message: str,
        kind: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.param = param
        self.code = code
        self.headers = headers

    def body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        }

    def anthropic_body(self) -> dict:
        """The Messages API's shape: its error type follows the status (a busy
        server's is Anthropic's overloaded_error)."""
        kind = ANTHROPIC_TYPES.get(self.status)
        if self.kind == "server_busy":
            kind = "overloaded_error"
        elif kind is None:
            kind = "api_error" if self.status >= 500 else "invalid_request_error"
        return {"type": "error", "error": {"type": kind, "message": self.message}}

    def body_for(self, path: str) -> dict:
        """The body in the shape of the API that `path` belongs to."""
        return self.anthropic_body() if is_anthropic(path) else self.body()

    def response(self, path: str = "") -> JSONResponse:
        return JSONResponse(
            self.body_for(path), status_code=self.status, headers=self.headers
        )


ANTHROPIC_PATHS = ("/v1/messages",)  # and below it: /v1/messages/count_tokens
ANTHROPIC_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
}


def is_anthropic(path: str) -> bool:
    return any(path == p or path.startswith(p + "/") for p in ANTHROPIC_PATHS)


def invalid(message: str, param: str | None, code: str = "invalid_value") -> ApiError:
    """A 400 for a request field that is missing, of the wrong type or out of range."""
    return ApiError(400, message, param=param, code=code)


def internal_message(error: Exception) -> str:
    return f"internal error: {type(error).__name__}: {error}"


def short(value, limit: int = 40) -> str:
    """A client's value for a message, cut to `limit` characters."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 3]}... ({len(text)} chars)"


def json_type(value) -> str:
    """The JSON name of a decoded value's type, as a client wrote it."""
    names = {bool: "a boolean", int: "a number", float: "a number", str: "a string"}
    names.update({list: "an array", dict: "an object", type(None): "null"})
    return names.get(type(value), type(value).__name__)


# The app's handlers: every refusal, and Starlette's own 404 and 405, in that shape.


async def answer_api_error(request: Request, error: ApiError) -> JSONResponse:
    """An ApiError's response, counted in request_rejected_total unless the
    server's own fault."""
    rejected = request.app.state.server.metrics.request_rejected
    if error.kind == "server_busy":
        rejected.labels("busy").inc()
    elif error.status < 500:
        rejected.labels("bad_request").inc()
    return error.response(request.url.path)


async def answer_http_error(request: Request, error: HTTPException) -> JSONResponse:
    """Starlette's refusals (no such path, a method the path does not take)."""
    kind = "not_found_error" if error.status_code == 404 else "invalid_request_error"
    message = {
        404: f"no endpoint {request.url.path}: see /v1/chat/completions, "
        "/v1/completions, /v1/responses, /v1/messages, /v1/models, /health, "
        "/metrics",
        405: f"{request.method} is not allowed on {request.url.path}",
    }.get(error.status_code, str(error.detail))
    return ApiError(error.status_code, message, kind).response(request.url.path)
