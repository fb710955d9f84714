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
        raise NotImplementedError(
            "Week 2 Day 6: record_token: append `now` to token_times and count the token"
        )

    @property
    def queue_time(self) -> float | None:
        raise NotImplementedError(
            "Week 2 Day 7: queue_time: prefill_start - arrival (None until both are known)"
        )

    @property
    def time_to_first_token(self) -> float | None:
        raise NotImplementedError(
            "Week 2 Day 7: time_to_first_token: first token time - arrival "
            "(None before the arrival or the first token)"
        )

    @property
    def inter_token_latencies(self) -> list[float]:
        raise NotImplementedError(
            "Week 2 Day 7: inter_token_latencies: the gaps between consecutive token_times"
        )

    @property
    def longest_stall(self) -> float:
        raise NotImplementedError(
            "Week 2 Day 7: longest_stall: the largest inter-token latency (0.0 if none)"
        )


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
        raise NotImplementedError(
            "Week 2 Day 7: record_prefill_chunk: count the chunk and its tokens, add its "
            "seconds, and update chunk_time_average (the first chunk sets it; later "
            "ones weigh 0.1)"
        )

    def record_decode_step(self, tokens: int, seconds: float) -> None:
        raise NotImplementedError(
            "Week 2 Day 7: record_decode_step: count the step, its tokens and its seconds"
        )

    @property
    def interleaving_ratio(self) -> float:
        """Prefill chunks per decode step: how finely prefill is mixed into decoding."""
        raise NotImplementedError(
            "Week 2 Day 7: interleaving_ratio: prefill_chunks / decode_steps "
            "(inf before the first decode step)"
        )

    @property
    def prompt_throughput(self) -> float:
        """Prompt tokens prefilled per second of the whole run."""
        raise NotImplementedError(
            "Week 2 Day 7: prompt_throughput: prefill_tokens / total_seconds (0.0 at 0 s)"
        )

    @property
    def generation_throughput(self) -> float:
        """Tokens generated per second of the whole run."""
        raise NotImplementedError(
            "Week 2 Day 7: generation_throughput: generated_tokens / total_seconds "
            "(0.0 at 0 s)"
        )
