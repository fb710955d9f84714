"""The live view the chat page polls (GET /engine): slots, queue, rates, the log
line, from the engine's latest snapshot."""

import time
from collections import deque

from tiny_llm_base import EngineConfig, SchedulerSnapshot

from .step_metrics import kv_cache_usage

RATE_WINDOW_S = 5.0  # tokens/s on the chat page: over this many seconds


class StatusPage:
    """What GET /engine shows. update(snapshot, now) after every step (the engine
    thread); last_log_line: the periodic log line, set by whoever writes it; view()
    from any thread."""

    def __init__(self, config: EngineConfig):
        self.config = config
        self.snapshot: SchedulerSnapshot | None = None
        self.rates: deque[tuple[float, int, int]] = deque(maxlen=4096)
        self.last_log_line = ""

    def update(self, snapshot: SchedulerSnapshot, now: float) -> None:
        run = snapshot.metrics
        self.rates.append((now, run.prefill_tokens, run.generated_tokens))
        self.snapshot = snapshot

    def view(self, failure: str | None, show_text: bool = True) -> dict:
        """The page's dict; `failure`: the engine's, if it failed. show_text False:
        the slots' positions without the end of their text."""
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
            "batch_size": self.config.batch_size,
            "running": 0 if snapshot is None else snapshot.metrics.running,
            "waiting": 0 if snapshot is None else snapshot.metrics.waiting,
            "finished": 0 if snapshot is None else snapshot.finished,
            "total": 0 if snapshot is None else snapshot.total,
            "prompt_tokens_per_s": prompt_rate,
            "generation_tokens_per_s": generation_rate,
            "kv_cache_usage": 0.0
            if snapshot is None
            else kv_cache_usage(snapshot, self.config.max_seq_len),
            "policy": self.config.policy,
            "last_log_line": self.last_log_line,
            "failure": failure,
        }
