"""Prometheus recording: what the engine thread writes into ServerMetrics after
each step (latencies per request, the engine's counters, the KV cache's size)."""

from tiny_llm_base import EngineConfig, SchedulerSnapshot
from tiny_llm_base.memory import kv_bytes_per_token, tokens_by_dtype

from .finish import finish_reason
from .metrics import ServerMetrics
from .streams import Stream


class StepRecorder:
    """Records into `metrics` for an engine of `config` running `model`; `run`: the
    engine's RunMetrics, read before the first step for the KV budget. counted:
    each counter's engine total as last recorded (the engine's figures are totals,
    Prometheus counters are incremented)."""

    def __init__(self, metrics: ServerMetrics, config: EngineConfig, model, run):
        self.metrics = metrics
        self.config = config
        self.model = model
        self.counted: dict[object, int] = {}
        self.record_kv(run)

    def record_tokens(self, stream: Stream, output, now: float) -> None:
        """One RequestOutput's tokens: the time to the first, the gaps after."""
        m = self.metrics
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

    def record_finish(self, stream: Stream, output, now: float) -> None:
        """A choice finished: its reason, latency and token counts."""
        m, result = self.metrics, output.result
        stopped = stream.stopped_by_string[output.index]
        m.request_success.labels(finish_reason(output.finish_reason, stopped)).inc()
        m.e2e.observe(now - stream.arrival)
        if result is not None:
            m.request_prompt_tokens.observe(result.metrics.prompt_tokens)
            m.request_generation_tokens.observe(len(result.tokens))
            if result.metrics.queue_time is not None:
                m.queue_time.observe(result.metrics.queue_time)
            m.prefix_cache_queries.inc(result.metrics.prompt_tokens)
            m.prefix_cache_hits.inc(result.cached_tokens)

    def record_step(self, snapshot: SchedulerSnapshot) -> None:
        """The engine's counters and gauges after a step."""
        m, run = self.metrics, snapshot.metrics
        m.engine_steps.inc()
        for counter, value in (
            (m.prompt_tokens, run.prefill_tokens),
            (m.prefill_chunks, run.prefill_chunks),
            (m.decode_steps, run.decode_steps),
            (m.preemptions, run.preemptions),
            (m.spec_drafts, run.drafts),
            (m.spec_draft_tokens, run.draft_tokens),
            (m.spec_accepted_tokens, run.accepted_draft_tokens),
        ):
            counter.inc(value - self.counted.get(counter, 0))
            self.counted[counter] = value
        m.running.set(run.running)
        m.waiting.set(run.waiting)
        m.kv_cache_usage.set(kv_cache_usage(snapshot, self.config.max_seq_len))
        self.record_kv(run)

    def record_kv(self, run) -> None:
        """The KV cache's budget in tokens, the paged pool's bytes and the bytes a
        token takes in it (at its kv_dtype), and a paged budget's tokens at each
        kv_dtype, from the engine's RunMetrics `run`."""
        tokens = kv_budget_tokens(run, self.config)
        self.metrics.kv_budget_tokens.set(tokens)
        self.metrics.kv_pool_bytes.set(run.kv_pool_bytes)
        kv_dtype = self.config.kv_dtype
        per_token = kv_bytes_per_token(self.model, kv_dtype)
        self.metrics.kv_bytes_per_token.labels(kv_dtype).set(per_token or 0)
        if run.kv_blocks_total and per_token:
            budget, size = tokens * per_token, run.kv_block_size
            for name, fit in tokens_by_dtype(self.model, budget, size).items():
                self.metrics.kv_budget_tokens_by_dtype.labels(name).set(fit)


def kv_cache_usage(snapshot: SchedulerSnapshot, max_seq_len: int) -> float:
    """Paged: the pool's blocks held by requests over all its blocks. Dense:
    positions held by the decode slots over what all slots can hold."""
    run = snapshot.metrics
    if run.kv_blocks_total:
        return run.kv_blocks_in_use / run.kv_blocks_total
    held = sum(view.offset for view in snapshot.slots if view is not None)
    return held / (len(snapshot.slots) * max_seq_len) if snapshot.slots else 0.0


def kv_budget_tokens(run, config: EngineConfig) -> int:
    """The tokens the KV cache can hold: a paged pool's blocks x block size, a dense
    cache's batch_size x max_seq_len (the config's when `run` has not counted it)."""
    if run.kv_blocks_total:
        return run.kv_blocks_total * run.kv_block_size
    return run.kv_dense_tokens or config.batch_size * config.max_seq_len
