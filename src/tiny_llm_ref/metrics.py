"""What a batch run measures: per request and per run.

The scheduler records times from its clock; nothing here prints. The CLIs and the
benchmark turn these numbers into tables, live views and plots.
"""

from dataclasses import dataclass, field


@dataclass
class RequestMetrics:
    """Times are seconds on the scheduler's clock.

    queue_time: arrival -> first prefill chunk. time_to_first_token: arrival -> first
    generated token. inter_token_latencies: gaps between consecutive tokens.
    """

    prompt_tokens: int = 0
    generated_tokens: int = 0
    arrival: float | None = None
    prefill_start: float | None = None
    token_times: list[float] = field(default_factory=list)
    prefill_chunks: int = 0

    def record_token(self, now: float) -> None:
        self.token_times.append(now)
        self.generated_tokens += 1

    @property
    def queue_time(self) -> float | None:
        if self.arrival is None or self.prefill_start is None:
            return None
        return self.prefill_start - self.arrival

    @property
    def time_to_first_token(self) -> float | None:
        if self.arrival is None or not self.token_times:
            return None
        return self.token_times[0] - self.arrival

    @property
    def inter_token_latencies(self) -> list[float]:
        return [b - a for a, b in zip(self.token_times, self.token_times[1:])]

    @property
    def longest_stall(self) -> float:
        return max(self.inter_token_latencies, default=0.0)


@dataclass
class RunMetrics:
    """Counters over a whole batch_generate run.

    chunk_time_average is an exponential moving average (weight 0.1 on the newest
    chunk), so it follows the chunk size the scheduler currently uses.
    """

    prefill_chunks: int = 0
    prefill_tokens: int = 0
    chunk_time_average: float = 0.0
    decode_steps: int = 0
    generated_tokens: int = 0
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    total_seconds: float = 0.0
    running: int = 0
    waiting: int = 0
    finished: int = 0
    longest_decode_stall: float = 0.0
    peak_memory_bytes: int = 0

    def record_prefill_chunk(self, tokens: int, seconds: float) -> None:
        if self.prefill_chunks == 0:
            self.chunk_time_average = seconds
        else:
            self.chunk_time_average = 0.9 * self.chunk_time_average + 0.1 * seconds
        self.prefill_chunks += 1
        self.prefill_tokens += tokens
        self.prefill_seconds += seconds

    def record_decode_step(self, tokens: int, seconds: float) -> None:
        self.decode_steps += 1
        self.generated_tokens += tokens
        self.decode_seconds += seconds

    @property
    def interleaving_ratio(self) -> float:
        """Prefill chunks per decode step: how finely prefill is mixed into decoding."""
        return (
            self.prefill_chunks / self.decode_steps
            if self.decode_steps
            else float("inf")
        )

    @property
    def prompt_throughput(self) -> float:
        """Prompt tokens prefilled per second of the whole run."""
        return self.prefill_tokens / self.total_seconds if self.total_seconds else 0.0

    @property
    def generation_throughput(self) -> float:
        """Tokens generated per second of the whole run."""
        return self.generated_tokens / self.total_seconds if self.total_seconds else 0.0
