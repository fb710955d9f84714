"""The routes for people and monitors: the chat page (/), /health, /metrics
(Prometheus) and /engine (the live view the chat page polls)."""

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ..state import Server, get

CHAT_PAGE = Path(__file__).parents[1] / "chat.html"

router = APIRouter()


@get(router, "/")
async def chat_page() -> HTMLResponse:
    return HTMLResponse(CHAT_PAGE.read_text(encoding="utf-8"))


@get(router, "/health")
async def health(server: Server) -> JSONResponse:
    if server.loop.failure is not None:
        return JSONResponse({"status": "failed", "error": server.loop.failure}, 503)
    return JSONResponse({"status": "ok"})


@get(router, "/metrics")
async def prometheus(server: Server) -> Response:
    return Response(
        generate_latest(server.metrics.registry), media_type=CONTENT_TYPE_LATEST
    )


@get(router, "/engine")
async def engine_status(server: Server) -> JSONResponse:
    # Without a key anyone who can connect reads this: positions, no text.
    show_text = server.settings.api_key is not None
    return JSONResponse(server.loop.status(show_text=show_text))
