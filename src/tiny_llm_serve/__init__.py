"""tiny-llm's OpenAI-compatible server: infrastructure over either package's Engine.

create_app(engine, settings) gives a FastAPI app; `pdm run serve`
(scripts/commands/serve.py) loads a model, builds the engine and runs the app with
uvicorn through serve(), on a socket from listen_socket(). One engine thread
owns MLX (engine_loop.py); the HTTP handlers (app.py) check requests (protocol.py),
hand them over and read their tokens from queues.
"""

from .app import ServerSettings, create_app
from .engine_loop import EngineLoop, Stream
from .errors import ApiError
from .metrics import ServerMetrics
from .server import listen_socket, serve
