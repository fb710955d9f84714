"""Errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.

Every refusal the server makes is an ApiError with a 4xx (or 503) status and a
message that says what to fix; the app turns it into that body. Nothing a client
sends may become a 500 or a stack trace.
"""

from fastapi.responses import JSONResponse


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

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def invalid(message: str, param: str | None, code: str = "invalid_value") -> ApiError:
    """A 400 for a request field that is missing, of the wrong type or out of range."""
    return ApiError(400, message, param=param, code=code)
