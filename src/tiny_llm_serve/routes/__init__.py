"""The app's routes, one module per API, each an APIRouter that create_app includes.

openai_completions: POST /v1/chat/completions and /v1/completions. models: GET
/v1/models and /v1/models/{id}. operations: the chat page (/), /health, /metrics
and /engine. Another API is another module here: its router, its body models
turned into GenerationRequests, and its own response format over
generation.start_generation; add its router to ROUTERS.
"""

from . import models, openai_completions, operations

ROUTERS = (openai_completions.router, models.router, operations.router)
