"""What the server tests (tests/test_serve*.py) share: uvicorn serving an app in a
thread of the test process, an engine whose step raises, chat prompts as the server
makes them, and waiting for the engine to go idle (bounded, on its own status)."""

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import tiny_llm_ref
import uvicorn

from tiny_llm_base import EngineConfig, PromptSpec
from tiny_llm_serve import ConstraintFactory

from .helpers import free_port

API_KEY = "test-key"
MAX_SEQ_LEN = 512
WAIT_S = 60  # the longest any one wait may take
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
HI = [{"role": "user", "content": "Hi"}]
# The reference's constraint kinds, passed to create_app beside its make_sampler.
REF_CONSTRAINTS = ConstraintFactory.of(tiny_llm_ref)
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
        deadline = time.monotonic() + WAIT_S
        while not self.server.started:
            assert self.thread.is_alive(), "the server thread died while starting"
            assert time.monotonic() < deadline, "the server did not start in time"
            time.sleep(0.05)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=WAIT_S)


class HeldEngine:
    """An engine whose steps a test can hold: within held_after(n), n more steps
    run, then step() waits until the block ends. A request is then surely still
    running when the test looks, however fast or loaded the machine (a readiness
    gate, not a sleep). Everything else is the engine's."""

    def __init__(self, engine):
        self.engine = engine
        self.gate = threading.Condition()
        self.steps_left: int | None = None

    def __getattr__(self, name: str):
        return getattr(self.engine, name)

    def step(self):
        with self.gate:
            self.gate.wait_for(lambda: self.steps_left is None or self.steps_left > 0)
            if self.steps_left is not None:
                self.steps_left -= 1
        return self.engine.step()

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
    """The Engine's interface as the server uses it, with a step that raises."""

    config = EngineConfig(batch_size=2, max_seq_len=64, policy="alternate")

    def __init__(self, tokenizer, vocab_size):
        self.tokenizer = tokenizer
        self.model = type("Model", (), {"vocab_size": vocab_size})()
        self.added = []

    def add_request(self, spec: PromptSpec) -> int:
        self.added.append(spec)
        return len(self.added) - 1

    def abort(self, request_id: int) -> None:
        pass

    def has_unfinished(self) -> bool:
        return bool(self.added)

    def step(self):
        raise NotImplementedError("Week 2 Day 6: Engine.step")

    def close(self) -> None:
        pass


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
