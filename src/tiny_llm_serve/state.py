"""What every route reaches: the server's settings and shared state.

create_app puts one ServerState on `app.state.server`; a route takes it as a
parameter annotated `Server` (a FastAPI dependency), so route modules hold no
globals and one process may serve several apps (the tests do).
"""

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import APIRouter, Depends, Request

from .constraints import ConstraintFactory
from .engine_loop import EngineLoop
from .engine_protocol import ServedEngine
from .metrics import ServerMetrics


@dataclass
class ServerSettings:
    """model_name: the one model id served (GET /v1/models); a request naming
    another gets 404. api_key: None, or the key every request but /health must
    send as `Authorization: Bearer KEY` or `x-api-key: KEY` (or as the password
    of HTTP Basic authentication, which is how a browser opens the chat page);
    without one,
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


@dataclass
class ServerState:
    """engine: either package's Engine, or a wrapper of it (a ServedEngine).
    loop: the engine thread. make_sampler(temp, top_p, top_k) and constraints: the
    engine's package's, for requests that sample or carry a structured-output
    option. admitting: requests between the busy check and their hand-over, which
    the busy check counts as waiting. started: when the app was made (the model's
    `created`)."""

    engine: ServedEngine
    settings: ServerSettings
    loop: EngineLoop
    metrics: ServerMetrics
    make_sampler: Callable
    constraints: ConstraintFactory
    admitting: int = 0
    started: int = field(default_factory=lambda: int(time.time()))


def server_state(request: Request) -> ServerState:
    return request.app.state.server


Server = Annotated[ServerState, Depends(server_state)]


def get(router: APIRouter, path: str):
    """A GET route that answers HEAD too, with the same headers and no body."""
    return router.api_route(path, methods=["GET", "HEAD"])
