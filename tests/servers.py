"""What the server tests (tests/test_serve*.py, test_client_check.py) share: uvicorn
serving an app in a thread of the test process, the engine of the package under test
(tests/solution.py: the reference, or yours with TINY_LLM_SOLUTION=learner) on the
embedded model served as the client tests talk to it, an engine whose step raises, chat
prompts as the server makes them, and waiting for the engine to go idle (bounded, on
its own status)."""

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import anthropic
import httpx
import openai
import uvicorn

from tiny_llm_base import EngineConfig, PromptSpec
from tiny_llm_serve import ConstraintFactory, ServerSettings, create_app

from scripts.commands.ports import free_port

from .helpers import TLS, WAIT_S
from .solution import tiny

API_KEY = "test-key"
MODEL = "test-model"  # the name the served model answers to
MAX_SEQ_LEN = 512
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
HI = [{"role": "user", "content": "Hi"}]
# The package's constraint kinds, passed to create_app beside its make_sampler.
CONSTRAINTS = ConstraintFactory.of(tiny)
SEA = "Write one sentence about the sea."  # a greedy answer long enough to cut


class RunningServer:
    """uvicorn serving `app` in a thread; stop() ends it."""

    def __init__(self, app):
        self.app = app
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            app, host="127.0.0.1", port=self.port, log_level="error", lifespan="on"
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        self.wait_until(lambda: self.server.started, "start")

    def wait_until(self, done, what: str) -> None:
        """Poll done() until it holds (bounded by WAIT_S); `what` names it."""
        deadline = time.monotonic() + WAIT_S
        while not done():
            assert self.thread.is_alive(), f"the server thread died before: {what}"
            assert time.monotonic() < deadline, f"the server did not {what} in time"
            time.sleep(0.02)

    @property
    def requests_answered(self) -> int:
        """Requests uvicorn has finished answering so far."""
        return self.server.server_state.total_requests

    def activity(self) -> set:
        """uvicorn's open connections and request tasks (one from a request's
        headers until its answer), now."""
        state = self.server.server_state
        return set(state.connections) | set(state.tasks)

    def wait_done_since(self, before: set) -> None:
        """Until every connection and request task begun after `before` (an
        activity()) has ended: whatever the server does about them, log lines
        too, is done."""
        self.wait_until(lambda: not self.activity() - before, "finish its work")

    def openai_client(self, api_key: str = API_KEY) -> openai.OpenAI:
        """The official client on this server: no retries, WAIT_S to answer."""
        return openai.OpenAI(
            base_url=self.url + "/v1",
            api_key=api_key,
            max_retries=0,
            timeout=WAIT_S,
            http_client=httpx.Client(verify=TLS),
        )

    def anthropic_client(self, api_key: str = API_KEY) -> anthropic.Anthropic:
        """openai_client's twin for /v1/messages: no retries, WAIT_S to answer."""
        return anthropic.Anthropic(
            base_url=self.url, api_key=api_key, max_retries=0, timeout=WAIT_S
        )

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=WAIT_S)


@contextmanager
def package_server(
    model_pair, constraints: ConstraintFactory = CONSTRAINTS, **settings
) -> Iterator[RunningServer]:
    """model_pair, (mlx_model, tokenizer): the embedded model, or conftest's
    protocol_model, on the package's engine (mixed policy, paged cache, 4 slots,
    MAX_SEQ_LEN), served as MODEL behind API_KEY: what the official-client tests
    talk to. Stopped on the way out. constraints: the package's kinds, or a test's
    (a grammar that forces a call the real one never allows); settings: more
    EngineConfig fields."""
    # A model of its own, never run on this thread: its weights are still lazy, and
    # the engine thread could not evaluate them unless the loop does it first.
    model = tiny.Qwen2ModelWeek2(model_pair[0], use_fast_kernels=True)
    engine = tiny.Engine(
        model,
        model_pair[1],
        batch_size=4,
        max_seq_len=MAX_SEQ_LEN,
        policy="mixed",
        kv_cache="paged",
        **settings,
    )
    settings = ServerSettings(MODEL, api_key=API_KEY)
    running = RunningServer(
        create_app(engine, settings, tiny.make_sampler, constraints)
    )
    try:
        yield running
    finally:
        running.stop()


class HeldEngine:
    """An engine whose steps a test can hold: within held_after(n), n more steps
    run, then step() waits until the block ends. A request is then surely still
    running when the test looks, however fast or loaded the machine (a readiness
    gate, not a sleep). A ServedEngine: every other member is the engine's."""

    def __init__(self, engine):
        self.engine = engine
        self.config, self.model = engine.config, engine.model
        self.tokenizer, self.metrics = engine.tokenizer, engine.metrics
        self.gate = threading.Condition()
        self.steps_left: int | None = None

    def add_request(self, spec: PromptSpec) -> int:
        return self.engine.add_request(spec)

    def abort(self, request_id: int, index: int | None = None) -> None:
        self.engine.abort(request_id, index)

    def has_unfinished(self) -> bool:
        return self.engine.has_unfinished()

    def step(self):
        with self.gate:
            self.gate.wait_for(lambda: self.steps_left is None or self.steps_left > 0)
            if self.steps_left is not None:
                self.steps_left -= 1
        return self.engine.step()

    def snapshot(self):
        return self.engine.snapshot()

    def close(self) -> None:
        self.engine.close()

    @contextmanager
    def held_after(self, steps: int) -> Iterator[None]:
        with self.gate:
            self.steps_left = steps
        try:
            yield
        finally:
            with self.gate:
                self.steps_left = None
                self.gate.notify_all()


class BrokenEngine:
    """A ServedEngine whose step raises, as a learner's unwritten day does."""

    config = EngineConfig(batch_size=2, max_seq_len=64, policy="alternate")

    def __init__(self, tokenizer, vocab_size):
        self.tokenizer = tokenizer
        self.model = type("Model", (), {"vocab_size": vocab_size})()
        self.metrics = tiny.RunMetrics()
        self.added = []

    def add_request(self, spec: PromptSpec) -> int:
        self.added.append(spec)
        return len(self.added) - 1

    def abort(self, request_id: int, index: int | None = None) -> None:
        pass

    def has_unfinished(self) -> bool:
        return bool(self.added)

    def step(self):
        raise NotImplementedError("Week 2 Day 6: Engine.step")

    def snapshot(self):
        raise NotImplementedError("Week 2 Day 6: Engine.snapshot")

    def close(self) -> None:
        pass


@contextmanager
def broken_server(tokenizer, vocab_size: int) -> Iterator[RunningServer]:
    """A BrokenEngine served as MODEL with no API key; stopped on the way out."""
    app = create_app(
        BrokenEngine(tokenizer, vocab_size),
        ServerSettings(MODEL),
        tiny.make_sampler,
        CONSTRAINTS,
    )
    running = RunningServer(app)
    try:
        yield running
    finally:
        running.stop()


def content_pieces(lines: Iterator[str], count: int) -> list[str]:
    """The next `count` non-empty delta contents of a chat stream's `lines` (its
    response.iter_lines(), which the caller keeps); fails with every line read if
    the stream ends first. A test that reads part of a stream and then looks at
    the server must keep that iterator: breaking out of `for line in
    response.iter_lines()` finalizes the generator, httpx then closes the
    connection, and the server aborts the request as a disconnect."""
    pieces, seen = [], []
    while len(pieces) < count:
        line = next(lines, None)
        assert line is not None, "the stream ended early:\n" + "\n".join(seen)
        seen.append(line)
        if line.startswith("data: {"):
            choices = json.loads(line[len("data: ") :]).get("choices") or [{}]
            content = choices[0].get("delta", {}).get("content")
            if content:
                pieces.append(content)
    return pieces


def chat_prompt(tokenizer, question: str) -> list[int]:
    messages = [{"role": "user", "content": question}]
    return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True))


def wait_idle(http) -> dict:
    """The engine status once nothing runs or waits (bounded)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        status = http.get("/engine").json()
        if status["running"] == 0 and status["waiting"] == 0:
            return status
        assert time.monotonic() < deadline, f"the engine did not go idle: {status}"
        time.sleep(0.05)
