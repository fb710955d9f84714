"""The engine as the server drives it: what the engine thread calls, declared.

Either package's Engine is one; so are the wrappers around it (rank 0's under
several ranks, a test's that holds steps) and a test's broken engine. Each says
every member itself: the server never probes an engine for what it may have.
"""

from typing import Protocol

from tiny_llm_base import EngineConfig, PromptSpec, SchedulerSnapshot


class EngineUnavailable(RuntimeError):
    """Raised by step() when the engine cannot go on until the server restarts (a
    rank went away): open requests end with a 503, not a 500."""


class ServedEngine(Protocol):
    """config: its EngineConfig (max_seq_len, batch_size, policy, kv_dtype).
    model: the model it runs (its weights evaluated on the thread that made it;
    the KV cache's bytes per token). tokenizer: what the routes tokenize prompts
    with. metrics: its RunMetrics (the KV budget before the first step).

    add_request and abort may be called from any thread; has_unfinished, step,
    snapshot and close only from the engine thread. step() returns each request's
    RequestOutput of that step (request_id, index, tokens, text, finish_reason,
    result, logprobs, prompt_logprobs)."""

    config: EngineConfig
    model: object
    tokenizer: object
    metrics: object

    def add_request(self, spec: PromptSpec) -> int: ...

    def abort(self, request_id: int, index: int | None = None) -> None: ...

    def has_unfinished(self) -> bool: ...

    def step(self) -> list: ...

    def snapshot(self) -> SchedulerSnapshot: ...

    def close(self) -> None: ...
