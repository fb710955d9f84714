"""tiny-llm's OpenAI-compatible server: infrastructure over either package's Engine.

create_app(engine, settings, make_sampler, constraints) gives a FastAPI app; `pdm run
serve` (scripts/commands/serve.py) loads a model, builds the engine and runs the app
with uvicorn through serve(), on a socket from listen_socket(). One engine thread
owns MLX (engine_loop.py), driving any engine that is a ServedEngine
(engine_protocol.py); the routes (routes/, one module per API) check request
bodies (pydantic models: openai_bodies.py), hand them over (generation.py) and read
their tokens from queues.
"""

from .app import create_app
from .constraints import ConstraintFactory
from .engine_loop import EngineLoop
from .engine_protocol import EngineUnavailable, ServedEngine
from .errors import ApiError
from .metrics import ServerMetrics
from .server import listen_socket, serve
from .state import ServerSettings
from .streams import Stream
