"""One thread owns the engine; HTTP handlers talk to it through queues.

MLX and the engine's caches are only ever touched by the engine thread: it runs
`engine.step()` while any request is unfinished and sleeps on an Event otherwise.
A handler hands a request over with `submit` (Engine.add_request only leaves a note
in the engine's inbox) and gets a Stream: an asyncio.Queue on the event loop that
the engine thread fills with each step's RequestOutput for that request, through
`loop.call_soon_threadsafe`. Neither side ever waits for the other: the event loop
never blocks on a step, and the engine never waits for a slow client.
"""

import threading
import time
from collections.abc import Callable, Iterator

import mlx.core as mx

from tiny_llm_base import PromptSpec, SchedulerSnapshot

from .engine_protocol import EngineUnavailable, ServedEngine
from .metrics import ServerMetrics
from .status_page import StatusPage
from .step_metrics import StepRecorder
from .streams import EngineFailure, Stream


class EngineLoop:
    """The engine thread and its streams. After each step it has `recorder` write
    the Prometheus metrics and `status_page` take the snapshot (GET /engine; its
    last_log_line is the command's to set).

    on_step(snapshot) is called on the engine thread after every step (the periodic
    log line hangs there). `unstarted`: ids handed over that have no token yet;
    the server refuses new requests while there are too many of them.
    """

    def __init__(
        self,
        engine: ServedEngine,
        metrics: ServerMetrics,
        on_step: Callable[[SchedulerSnapshot], None] | None = None,
    ):
        self.engine = engine
        self.on_step = on_step
        self.lock = threading.Lock()  # streams and unstarted: submit vs record
        self.streams: dict[int, Stream] = {}
        self.unstarted: set[int] = set()
        self.wakeup = threading.Event()
        self.stopping = False
        self.failure: str | None = None
        self.failure_status = 500
        self.recorder = StepRecorder(
            metrics, engine.config, engine.model, engine.metrics
        )
        self.status_page = StatusPage(engine.config)
        self.thread = threading.Thread(target=self.run, name="engine", daemon=True)
        mx.eval(list(arrays_in(engine.model)))  # see arrays_in

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopping = True
        self.wakeup.set()
        self.thread.join(timeout=30)

    def submit(self, spec: PromptSpec, stream: Stream) -> int:
        """Hand a request to the engine (any thread); its outputs go to `stream`."""
        with self.lock:
            if self.failure is not None:  # failed (or stopping) since it was checked
                stream.put(EngineFailure(self.failure, self.failure_status))
                return -1
            stream.arrival = time.perf_counter()
            request_id = self.engine.add_request(spec)
            stream.request_id = request_id
            self.streams[request_id] = stream
            self.unstarted.add(request_id)
        self.wakeup.set()
        return request_id

    def abort(self, request_id: int, index: int | None = None) -> None:
        """Stop a request, or only its choice `index` (any thread): its slot is
        free after the next step."""
        if request_id is None:  # never handed to the engine
            return
        self.engine.abort(request_id, index)
        self.wakeup.set()

    @property
    def waiting(self) -> int:
        return len(self.unstarted)

    def run(self) -> None:
        """Step the engine while it has work, until stop(); then close it here, on
        the engine thread (the disk tier writes its blocks: Engine.close)."""
        while not self.stopping:
            if self.failure is not None or not self.engine.has_unfinished():
                self.wakeup.wait(timeout=1.0)
                self.wakeup.clear()
                continue
            try:
                outputs = self.engine.step()
                snapshot = self.engine.snapshot()
            except EngineUnavailable as error:  # it says so itself: a restart helps
                self.fail_all(str(error), 503)
                continue
            except Exception as error:  # the engine itself is broken: say so to all
                self.fail_all(f"the engine failed: {type(error).__name__}: {error}")
                continue
            now = time.perf_counter()
            # Record the finishes, then publish the step, then hand out its
            # tokens: a client that sees its tokens sees this step's /engine, and
            # one that sees /engine idle sees every finish counted in /metrics.
            with self.lock:
                received = [(self.record(output, now), output) for output in outputs]
            self.recorder.record_step(snapshot)
            self.status_page.update(snapshot, now)
            for stream, output in received:
                if stream is not None:
                    stream.put(output)
            if self.on_step is not None:
                self.on_step(snapshot)
        self.engine.close()

    def record(self, output, now: float) -> Stream | None:
        """Record one RequestOutput (its tokens' latencies, its finish); its
        stream, to put it on, or None when nobody waits for it."""
        stream = self.streams.get(output.request_id)
        if stream is None:
            return None
        if output.tokens:
            self.unstarted.discard(output.request_id)
            self.recorder.record_tokens(stream, output, now)
        if output.finish_reason is not None:
            stream.unfinished -= 1
            if not stream.unfinished:
                del self.streams[output.request_id]
                self.unstarted.discard(output.request_id)
            self.recorder.record_finish(stream, output, now)
        return stream

    def fail_all(self, message: str, status: int = 500) -> None:
        """engine.step() raised: every open request ends with the error, and later
        ones are refused (failure is kept) until the server restarts."""
        self.failure, self.failure_status = message, status
        with self.lock:
            streams, self.streams = self.streams, {}
            self.unstarted.clear()
        for stream in streams.values():
            stream.put(EngineFailure(message, status))

    def shut_down(self) -> None:
        """The server is stopping (any thread): open requests end now with a 503,
        streams with an error event instead of being cut, and the engine takes no
        more steps."""
        self.fail_all(
            "the server is shutting down: send the request again once it is back",
            status=503,
        )
        self.wakeup.set()

    def status(self, show_text: bool = True) -> dict:
        """The live view the chat page polls (StatusPage.view)."""
        return self.status_page.view(self.failure, show_text)


def arrays_in(value, seen: set[int] | None = None) -> Iterator[mx.array]:
    """Every MLX array reachable from `value` through attributes, lists, tuples and
    dicts. A lazy array belongs to the stream of the thread that made it, and the
    engine thread cannot evaluate it ("There is no Stream(cpu, 0) in current
    thread"): a model built and never run keeps its weights lazy, so the loop
    evaluates them on the thread that makes it."""
    seen = set() if seen is None else seen
    if id(value) in seen or isinstance(value, (str, bytes, int, float, bool)):
        return
    seen.add(id(value))
    if isinstance(value, mx.array):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from arrays_in(item, seen)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from arrays_in(item, seen)
    elif hasattr(value, "__dict__"):
        yield from arrays_in(vars(value), seen)
