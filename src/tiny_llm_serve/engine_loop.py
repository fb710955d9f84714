"""One thread owns the engine; HTTP handlers talk to it through queues.

MLX and the engine's caches are only ever touched by the engine thread: it runs
`engine.step()` while any request is unfinished and sleeps on an Event otherwise.
A handler hands a request over with `submit` (Engine.add_request only leaves a note
in the engine's inbox) and gets a Stream: an asyncio.Queue on the event loop that
the engine thread fills with each step's RequestOutput for that request, through
`loop.call_soon_threadsafe`. Neither side ever waits for the other: the event loop
never blocks on a step, and the engine never waits for a slow client.
"""

import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator

import mlx.core as mx

from tiny_llm_base import PromptSpec, SchedulerSnapshot
from tiny_llm_base.memory import kv_bytes_per_token, tokens_by_dtype

from .metrics import ServerMetrics
from .stop_strings import StopStrings

RATE_WINDOW_S = 5.0  # tokens/s on the chat page: over this many seconds


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


class EngineLoop:
    """The engine thread, its streams, and the metrics it records after each step.

    on_step(snapshot) is called on the engine thread after every step (the periodic
    log line hangs there). `unstarted`: ids handed over that have no token yet;
    the server refuses new requests while there are too many of them.
    """

    def __init__(
        self,
        engine,
        metrics: ServerMetrics,
        on_step: Callable[[SchedulerSnapshot], None] | None = None,
    ):
        self.engine = engine
        self.metrics = metrics
        self.on_step = on_step
        self.lock = threading.Lock()  # streams and unstarted: submit vs record
        self.streams: dict[int, Stream] = {}
        self.unstarted: set[int] = set()
        self.wakeup = threading.Event()
        self.stopping = False
        self.failure: str | None = None
        self.failure_status = 500
        self.snapshot: SchedulerSnapshot | None = None
        self.rates: deque[tuple[float, int, int]] = deque(maxlen=4096)
        self.last_log_line = ""
        self.counted = dict.fromkeys(
            (
                "prefill_tokens",
                "prefill_chunks",
                "decode_steps",
                "preemptions",
                "drafts",
                "draft_tokens",
                "accepted_draft_tokens",
            ),
            0,
        )
        self.thread = threading.Thread(target=self.run, name="engine", daemon=True)
        self.record_kv(getattr(engine, "metrics", None))  # before the first step
        model = getattr(getattr(engine, "engine", engine), "model", None)
        mx.eval(list(arrays_in(model)))  # see arrays_in

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
        if index is None:
            self.engine.abort(request_id)
        else:
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
            except Exception as error:  # the engine itself is broken: say so to all
                status = getattr(error, "http_status", 500)  # its own, if it says
                if status == 500:
                    error = f"the engine failed: {type(error).__name__}: {error}"
                self.fail_all(str(error), status)
                continue
            now = time.perf_counter()
            # Record the finishes, then publish the step, then hand out its
            # tokens: a client that sees its tokens sees this step's /engine, and
            # one that sees /engine idle sees every finish counted in /metrics.
            with self.lock:
                received = [(self.record(output, now), output) for output in outputs]
            self.record_step(snapshot, now)
            for stream, output in received:
                if stream is not None:
                    stream.put(output)
            if self.on_step is not None:
                self.on_step(snapshot)
        self.engine.close()

    def record(self, output, now: float) -> Stream | None:
        """Record one RequestOutput's latencies (and its finish); its stream, to
        put it on, or None when nobody waits for it."""
        stream = self.streams.get(output.request_id)
        if stream is None:
            return None
        m = self.metrics
        if output.tokens:
            self.unstarted.discard(output.request_id)
            m.generation_tokens.inc(len(output.tokens))
            # The tokens of one output reach the client together: the first of
            # them ends the gap since the last output, the others follow at once.
            if stream.first_token_at is None:
                stream.first_token_at = now
                m.ttft.observe(now - stream.arrival)
            else:
                m.itl.observe(now - stream.last_token_at)
            for _ in output.tokens[1:]:
                m.itl.observe(0.0)
            stream.last_token_at = now
        if output.finish_reason is not None:
            stream.unfinished -= 1
            if not stream.unfinished:
                del self.streams[output.request_id]
                self.unstarted.discard(output.request_id)
            self.record_finish(stream, output, now)
        return stream

    def record_finish(self, stream: Stream, output, now: float) -> None:
        m, result = self.metrics, output.result
        stopped = stream.stopped_by_string[output.index]
        reason = finish_reason(output.finish_reason, stopped)
        m.request_success.labels(reason).inc()
        m.e2e.observe(now - stream.arrival)
        if result is not None:
            m.request_prompt_tokens.observe(result.metrics.prompt_tokens)
            m.request_generation_tokens.observe(len(result.tokens))
            if result.metrics.queue_time is not None:
                m.queue_time.observe(result.metrics.queue_time)
            m.prefix_cache_queries.inc(result.metrics.prompt_tokens)
            m.prefix_cache_hits.inc(result.cached_tokens)

    def record_step(self, snapshot: SchedulerSnapshot, now: float) -> None:
        m, run = self.metrics, snapshot.metrics
        m.engine_steps.inc()
        for name, counter in (
            ("prefill_tokens", m.prompt_tokens),
            ("prefill_chunks", m.prefill_chunks),
            ("decode_steps", m.decode_steps),
            ("preemptions", m.preemptions),
            ("drafts", m.spec_drafts),
            ("draft_tokens", m.spec_draft_tokens),
            ("accepted_draft_tokens", m.spec_accepted_tokens),
        ):
            value = getattr(run, name)
            counter.inc(value - self.counted[name])
            self.counted[name] = value
        m.running.set(run.running)
        m.waiting.set(run.waiting)
        m.kv_cache_usage.set(kv_cache_usage(snapshot, self.engine.config.max_seq_len))
        self.record_kv(run)
        self.rates.append((now, run.prefill_tokens, run.generated_tokens))
        self.snapshot = snapshot

    def record_kv(self, run) -> None:
        """The KV cache's budget in tokens, the paged pool's bytes and the bytes a
        token takes in it (at its kv_dtype), and a paged budget's tokens at each
        kv_dtype, from the engine's RunMetrics `run` (None: an engine without them,
        sized from its config)."""
        config = self.engine.config
        tokens = kv_budget_tokens(run, config)
        self.metrics.kv_budget_tokens.set(tokens)
        self.metrics.kv_pool_bytes.set(getattr(run, "kv_pool_bytes", 0))
        kv_dtype = getattr(config, "kv_dtype", "float32")
        model = getattr(self.engine, "model", None)
        per_token = kv_bytes_per_token(model, kv_dtype)
        self.metrics.kv_bytes_per_token.labels(kv_dtype).set(per_token or 0)
        if getattr(run, "kv_blocks_total", 0) and per_token:
            budget, size = tokens * per_token, run.kv_block_size
            for name, fit in tokens_by_dtype(model, budget, size).items():
                self.metrics.kv_budget_tokens_by_dtype.labels(name).set(fit)

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
        """The live view the chat page polls: slots, queue, rates, the log line.
        show_text False: the slots' positions without the end of their text."""
        snapshot = self.snapshot
        now = time.perf_counter()
        recent = [r for r in self.rates if r[0] >= now - RATE_WINDOW_S]
        older = [r for r in self.rates if r[0] < now - RATE_WINDOW_S]
        prompt_rate = generation_rate = 0.0
        if recent:
            base = older[-1] if older else recent[0]
            seconds = max(now - base[0], 1e-9)
            prompt_rate = (recent[-1][1] - base[1]) / seconds
            generation_rate = (recent[-1][2] - base[2]) / seconds
        slots = [] if snapshot is None else snapshot.slots
        return {
            "step": 0 if snapshot is None else snapshot.step,
            "slots": [
                None
                if view is None
                else {
                    "request": view.request,
                    "priority": view.priority,
                    "offset": view.offset,
                    "generated": view.generated,
                }
                | ({"text_tail": view.text_tail} if show_text else {})
                for view in slots
            ],
            "batch_size": self.engine.config.batch_size,
            "running": 0 if snapshot is None else snapshot.metrics.running,
            "waiting": 0 if snapshot is None else snapshot.metrics.waiting,
            "finished": 0 if snapshot is None else snapshot.finished,
            "total": 0 if snapshot is None else snapshot.total,
            "prompt_tokens_per_s": prompt_rate,
            "generation_tokens_per_s": generation_rate,
            "kv_cache_usage": 0.0
            if snapshot is None
            else kv_cache_usage(snapshot, self.engine.config.max_seq_len),
            "policy": self.engine.config.policy,
            "last_log_line": self.last_log_line,
            "failure": self.failure,
        }


def finish_reason(engine_reason: str, stopped_by_string: bool) -> str:
    """The OpenAI finish_reason of an engine finish reason: a full slot is
    "length"; an abort the server made for a stop string is "stop"."""
    if engine_reason == "abort" and stopped_by_string:
        return "stop"
    return "length" if engine_reason == "max_seq_len" else engine_reason


def kv_cache_usage(snapshot: SchedulerSnapshot, max_seq_len: int) -> float:
    """Paged: the pool's blocks held by requests over all its blocks. Dense:
    positions held by the decode slots over what all slots can hold."""
    run = snapshot.metrics
    if run.kv_blocks_total:
        return run.kv_blocks_in_use / run.kv_blocks_total
    held = sum(view.offset for view in snapshot.slots if view is not None)
    return held / (len(snapshot.slots) * max_seq_len) if snapshot.slots else 0.0


def kv_budget_tokens(run, config) -> int:
    """The tokens the KV cache can hold: a paged pool's blocks x block size, a dense
    cache's batch_size x max_seq_len (the config's when `run` does not say)."""
    if run is not None and getattr(run, "kv_blocks_total", 0):
        return run.kv_blocks_total * run.kv_block_size
    dense = getattr(run, "kv_dense_tokens", 0)
    return dense or config.batch_size * config.max_seq_len


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
