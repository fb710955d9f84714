"""What the engine thread hands a waiting HTTP request: its outputs, or a failure.

A Stream is an asyncio.Queue on the event loop that the engine thread fills through
`loop.call_soon_threadsafe`, so neither side ever waits for the other.
"""

import asyncio

from .stop_strings import StopStrings


class EngineFailure:
    """Put into every open stream when engine.step() itself raised (status 500:
    the engine is broken, a bug or a learner's unwritten day), or when the server
    is stopping (503)."""

    def __init__(self, message: str, status: int = 500):
        self.message = message
        self.status = status


class Stream:
    """What one HTTP request receives from the engine thread, for its n choices.

    queue: RequestOutputs of every choice (and at most one EngineFailure), read on
    `loop`. arrival: when it was handed to the engine (time.perf_counter, the
    engine's clock); first_token_at, last_token_at: when its latest tokens came.
    stops[i]: the request's stop strings over choice i's text (never inside a
    tool call: calls, the request offers tools). stopped_by_string[i]:
    the server aborted choice i because one appeared, so it counts as finished with
    "stop". unfinished: choices the engine has not finished yet (engine thread).
    constraint_param: the field of its structured-output option, if any.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        stops: list[str] = (),
        n: int = 1,
        calls: bool = False,
    ):
        self.loop = loop
        self.n = n
        self.stops = [StopStrings(list(stops), calls) for _ in range(n)]
        self.queue: asyncio.Queue = asyncio.Queue()
        self.request_id: int | None = None
        self.arrival = 0.0
        self.first_token_at: float | None = None
        self.last_token_at: float | None = None
        self.stopped_by_string = [False] * n
        self.unfinished = n
        self.constraint_param: str | None = None  # the request's constraint field

    def put(self, item) -> None:
        """Called on the engine thread: queue `item` on the event loop."""
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:  # the event loop has closed: nobody is listening
            pass
