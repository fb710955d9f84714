"""The app's routes, one module per API, each an APIRouter that create_app includes.

openai_completions: POST /v1/chat/completions and /v1/completions.
openai_responses: POST /v1/responses (OpenAI's Responses API). anthropic_messages:
POST /v1/messages and /v1/messages/count_tokens (Anthropic's Messages API).
models: GET /v1/models and /v1/models/{id}. operations: the chat page (/),
/health, /metrics and /engine. Another API is another module here: its router, its body models
turned into GenerationRequests, and its own response format over
generation.start_generation, read through answers.py; add its router to ROUTERS.
"""

from . import (
    anthropic_messages,
    models,
    openai_completions,
    openai_responses,
    operations,
)

ROUTERS = (
    openai_completions.router,
    openai_responses.router,
    anthropic_messages.router,
    models.router,
    operations.router,
)
