"""What a batch run measures: per request and per run.

Every time is a reading of the engine's `clock` (seconds; time.perf_counter by
default). The engine (its reports, reporting.py), the model runner and the requests
record; nothing here prints: the CLIs and the benchmarks turn these numbers into
tables, live views and plots.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class RequestMetrics:
    """One request's counts and times.

    prompt_tokens: the prompt's length in tokens, set when the Request is created (0
        for a prompt it rejects).
    generated_tokens: tokens sampled and accepted, one per record_token call: the
        first, sampled by the last prefill chunk, counts, and so does the EOS that
        ends a request (then it is len(GenerationResult.tokens) + 1).
    arrival: read by the engine when it admits the request, at the start of the
        iteration its arrival_step names (a rejected prompt gets one too).
    prefill_start: read by the model runner just before the request's first prefill
        chunk.
    token_times: one time per generated token, EOS included, read from `clock` by
        record_token when Request.accept takes the token: for the first, after the
        last prefill chunk; for the others, after the decode step that sampled them.
    prefill_chunks: prefill chunks the request took (1 for a prompt prefilled whole),
        counted by the engine's reports (Reports.record).
    cached_tokens: prompt tokens whose keys and values a paged engine found in its
        prefix cache at the request's admission (week 3 day 3): its prefill started
        there. preemptions: how often it was preempted (Request.restart: week 3 day 1's
        priorities, day 2's paged pool).
    draft_tokens, accepted_draft_tokens: draft tokens it proposed, and how many of
        them were accepted (week 3 day 4).
    clock: the request's clock (Request's `clock`), read for token_times and, when
        nobody read it, for arrival (Planner.add).

    queue_time: arrival -> prefill_start. time_to_first_token (TTFT): arrival ->
    token_times[0]. Both are None until their times are known.
    inter_token_latencies: the gaps between consecutive token_times; longest_stall:
    the largest of them (0.0 with fewer than two tokens).
    """

    prompt_tokens: int = 0
    generated_tokens: int = 0
    arrival: float | None = None
    prefill_start: float | None = None
    token_times: list[float] = field(default_factory=list)
    prefill_chunks: int = 0
    cached_tokens: int = 0
    preemptions: int = 0
    draft_tokens: int = 0
    accepted_draft_tokens: int = 0
    clock: Callable[[], float] = field(
        default=time.perf_counter, repr=False, compare=False
    )

    def record_token(self) -> None:
        """Count one generated token, accepted now (a reading of `clock`)."""
        self.token_times.append(self.clock())
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
    """Counters over a whole run, kept by the engine (Engine.metrics).

    prefill_chunks, prefill_tokens, prefill_seconds: the prefill chunks run, the
        prompt tokens they processed and the time they took (record_prefill_chunk).
    chunk_time_average: an exponential moving average of chunk times: the first chunk
        sets it, then average = 0.9 * average + 0.1 * seconds, so it follows the chunk
        size in use.
    decode_steps, decode_seconds: the decode steps run (none in an iteration with no
        request in a slot) and the time they took (record_decode_step).
    generated_tokens: tokens sampled, EOS included: one for each request whose last
        prefill chunk sampled its first token, plus one per occupied slot in every
        decode step.
    total_seconds: from the start of the run to the end of its latest iteration.
    running, waiting, finished: at the end of the latest iteration, the requests in
        a decode slot; the requests admitted but not yet in a slot (prefilling, or
        prefilled and waiting for a slot); the requests finished, whatever the reason
        (a prompt rejected when its Request was created counts from the start).
    longest_decode_stall: the longest gap between two consecutive tokens of any one
        request: the largest RequestMetrics.longest_stall.
    peak_memory_bytes: mx.get_peak_memory() at the end of the latest iteration (the
        peak is reset when the run starts).
    mixed_steps, mixed_seconds: the mixed policy's forwards (week 3 day 1) and their
        time; their chunks and decode tokens count in the counters above, their
        seconds only here (record_mixed_step).
    kv_dense_tokens: the positions a dense cache preallocates, batch_size x
        max_seq_len: what paged memory is compared with.
    With a paged KV cache (week 3 day 2), at the end of the latest iteration
    (record_blocks): kv_blocks_total and kv_block_size, the pool's budget (it holds
    kv_blocks_total x kv_block_size tokens); kv_pool_bytes, what its arrays take
    now (they grow towards the budget as blocks are used);
    kv_blocks_in_use, blocks some request holds, and kv_peak_blocks_in_use, the
    most held at once, even within an iteration (the pool's peak_in_use);
    kv_blocks_cached, hashed blocks nobody holds (day 3); kv_bytes_per_token, keys
    and values of one token over all layers.
    preemptions: requests preempted, to free KV blocks or for an interactive
        request (each recomputes later).
    prefix_prompt_tokens, prefix_cached_tokens: over requests admitted to a paged
    engine (once each, at their first admission), prompt tokens, and how many of
    them came from the prefix cache (set by the PrefixCachingKvManager, week 3 day 3).
    drafts, draft_tokens, accepted_draft_tokens (week 3 day 4, vLLM's
    spec_decode_num_drafts, _num_draft_tokens, _num_accepted_tokens): decode rows
    that carried drafts, the draft tokens they carried, and those accepted (each also
    a generated token); mean_accepted_length and draft_acceptance_rate follow.
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
    mixed_steps: int = 0
    mixed_seconds: float = 0.0
    kv_dense_tokens: int = 0
    kv_blocks_total: int = 0
    kv_block_size: int = 0
    kv_pool_bytes: int = 0
    kv_blocks_in_use: int = 0
    kv_peak_blocks_in_use: int = 0
    kv_blocks_cached: int = 0
    kv_bytes_per_token: int = 0
    preemptions: int = 0
    prefix_prompt_tokens: int = 0
    prefix_cached_tokens: int = 0
    drafts: int = 0
    draft_tokens: int = 0
    accepted_draft_tokens: int = 0

    def record_prefill_chunk(self, tokens: int, seconds: float) -> None:
        """Count one prefill chunk of `tokens` prompt tokens that took `seconds`."""
        if self.prefill_chunks == 0:
            self.chunk_time_average = seconds
        else:
            self.chunk_time_average = 0.9 * self.chunk_time_average + 0.1 * seconds
        self.prefill_chunks += 1
        self.prefill_tokens += tokens
        self.prefill_seconds += seconds

    def record_decode_step(self, tokens: int, seconds: float) -> None:
        """Count one decode step that generated `tokens` tokens in `seconds`."""
        self.decode_steps += 1
        self.generated_tokens += tokens
        self.decode_seconds += seconds

    def record_mixed_step(
        self, chunk_tokens: list[int], decode_tokens: int, seconds: float
    ) -> None:
        """Count one mixed forward: a prefill chunk per entry of `chunk_tokens`, one
        decode step if it generated `decode_tokens` > 0, and its `seconds` once."""
        self.prefill_chunks += len(chunk_tokens)
        self.prefill_tokens += sum(chunk_tokens)
        if decode_tokens:
            self.decode_steps += 1
            self.generated_tokens += decode_tokens
        self.mixed_steps += 1
        self.mixed_seconds += seconds

    def record_blocks(
        self, in_use: int, peak_in_use: int, cached: int, bytes_per_token: int
    ) -> None:
        """The pool at the end of an iteration: blocks held, the most ever held at
        once (the pool's peak_in_use), blocks cached."""
        self.kv_blocks_in_use = in_use
        self.kv_peak_blocks_in_use = max(self.kv_peak_blocks_in_use, peak_in_use)
        self.kv_blocks_cached = cached
        self.kv_bytes_per_token = bytes_per_token

    def record_drafts(self, proposed: int, accepted: int) -> None:
        """Count one verification: `proposed` draft tokens, `accepted` of them kept
        (each a generated token beside the decode row's own)."""
        self.drafts += 1
        self.draft_tokens += proposed
        self.accepted_draft_tokens += accepted
        self.generated_tokens += accepted

    @property
    def mean_accepted_length(self) -> float:
        """Tokens a drafting row produced per step: 1 + accepted drafts per
        verification (0.0 before any)."""
        return 1 + self.accepted_draft_tokens / self.drafts if self.drafts else 0.0

    @property
    def draft_acceptance_rate(self) -> float:
        """Accepted draft tokens / draft tokens proposed (0.0 before any)."""
        if not self.draft_tokens:
            return 0.0
        return self.accepted_draft_tokens / self.draft_tokens

    @property
    def prefix_cache_hit_rate(self) -> float:
        """Cached prompt tokens / prompt tokens admitted (0.0 before any)."""
        if not self.prefix_prompt_tokens:
            return 0.0
        return self.prefix_cached_tokens / self.prefix_prompt_tokens

    @property
    def kv_peak_tokens(self) -> int:
        """Positions the most blocks ever held at once can store."""
        return self.kv_peak_blocks_in_use * self.kv_block_size

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
