"""The OpenAI-compatible HTTP server: create_app assembles it.

The parts: the shared state every route reaches (state.py), the routes, one module
per API (routes/), errors in OpenAI's shape (errors.py) and the middleware that
answers unexpected errors and checks the API key (middleware.py). A generation
request goes: read and check its body (json_body.py, openai_bodies.py), hand it to
the engine thread (generation.py, engine_loop.py), write the answer as the API's
objects, whole or streamed.
"""

from collections.abc import Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.exceptions import HTTPException

from tiny_llm_base import SchedulerSnapshot

from .constraints import ConstraintFactory
from .engine_loop import EngineLoop
from .engine_protocol import ServedEngine
from .errors import ApiError, answer_api_error, answer_http_error
from .metrics import ServerMetrics
from .middleware import AnswerUnexpectedErrors, RequireApiKey
from .routes import ROUTERS
from .state import ServerSettings, ServerState


def create_app(
    engine: ServedEngine,
    settings: ServerSettings,
    make_sampler: Callable,
    constraints: ConstraintFactory,
    on_step: Callable[[SchedulerSnapshot], None] | None = None,
) -> FastAPI:
    """The app serving `engine` (either package's Engine, or a ServedEngine). make_sampler(temp, top_p,
    top_k) and constraints: the engine's package's (ConstraintFactory.of(package)),
    for requests with temperature > 0 (greedy ones use the engine's default
    sampler) and for structured outputs. on_step(snapshot): called on the engine
    thread after every step. The engine thread starts and stops with the app."""
    metrics = ServerMetrics()
    loop = EngineLoop(engine, metrics, on_step)
    server = ServerState(engine, settings, loop, metrics, make_sampler, constraints)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        loop.start()
        yield
        loop.stop()

    app = FastAPI(title="tiny-llm", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.server = server
    app.state.engine_loop = loop  # what serve() and the CLI stop
    app.add_exception_handler(ApiError, answer_api_error)
    app.add_exception_handler(HTTPException, answer_http_error)
    if settings.api_key:
        app.add_middleware(RequireApiKey, key=settings.api_key, metrics=metrics)
    app.add_middleware(AnswerUnexpectedErrors)  # outermost: sees every error
    for router in ROUTERS:
        app.include_router(router)
    return app
