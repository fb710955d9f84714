"""GET /v1/models and /v1/models/{id}: the one model this server has."""

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from ..errors import ApiError, short
from ..state import Server, ServerState, get

router = APIRouter()


def model_object(server: ServerState) -> dict:
    return {
        "id": server.settings.model_name,
        "object": "model",
        "created": server.started,
        "owned_by": "tiny-llm",
        "max_model_len": server.engine.config.max_seq_len,
    }


@get(router, "/v1/models")
async def models(server: Server) -> JSONResponse:
    return JSONResponse({"object": "list", "data": [model_object(server)]})


@get(router, "/v1/models/{model_id:path}")
async def model(model_id: str, server: Server) -> JSONResponse:
    name = server.settings.model_name
    if model_id != name:
        raise ApiError(
            404,
            f"the model {short(model_id)} is not served here: this server has "
            f"{name!r} only (GET /v1/models lists it)",
            "not_found_error",
            param="model",
            code="model_not_found",
        )
    return JSONResponse(model_object(server))
