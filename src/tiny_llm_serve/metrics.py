"""The server's Prometheus metrics, named like vLLM's (`vllm:` becomes `tiny_llm:`).

Each server has its own CollectorRegistry, so several can live in one process (the
tests start more than one). The engine thread records; GET /metrics renders.

Latencies are seen from the server: a request arrives when the engine is handed
it; its first token when the step that sampled it ends. Token counters count what
the engine did: prompt tokens it prefilled, tokens it generated for clients.
"""

import mlx.core as mx
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

PREFIX = "tiny_llm:"
LATENCY_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
    1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)


class ServerMetrics:
    """Histograms, counters and gauges of one server. Names (each with PREFIX):

    time_to_first_token_seconds, inter_token_latency_seconds,
    e2e_request_latency_seconds, request_queue_time_seconds: histograms.
    request_prompt_tokens, request_generation_tokens: histograms per request.
    prompt_tokens_total, generation_tokens_total: tokens prefilled and generated.
    prefill_chunks_total, decode_steps_total, engine_steps_total: the engine's work;
    num_preemptions_total: requests preempted (to free KV blocks, or for an
    interactive request); each recomputes later.
    spec_decode_num_drafts_total, spec_decode_num_draft_tokens_total,
    spec_decode_num_accepted_tokens_total (vLLM's names): decode rows that carried
    draft tokens, the draft tokens, and those accepted (week 3 day 4); the mean
    accepted length is 1 + accepted / drafts.
    request_success_total{finished_reason}: finished requests, by reason (stop,
    length, abort, error). request_rejected_total{reason}: refused before the engine
    saw them (bad_request, busy, unauthorized).
    num_requests_running, num_requests_waiting: the engine's slots in use and its
    queue after the latest step. kv_cache_usage_perc (0 to 1): a paged cache's
    blocks in use over its pool; a dense cache's positions held in the decode slots
    over what the slots can hold. kv_budget_tokens: the tokens the KV cache can
    hold (a paged pool's blocks x block size; a dense cache's batch_size x
    max_seq_len). kv_pool_bytes: the bytes a paged pool's arrays hold now (they grow
    towards the budget as blocks are used; 0 for a dense cache).
    kv_bytes_per_token{kv_dtype}: the bytes one token's keys and values take, at the
    pool's kv_dtype (float32, float16, int8, int4): the budget's bytes over its
    tokens. kv_budget_tokens_by_dtype{kv_dtype}: the tokens the same budget's bytes
    would hold at each kv_dtype (a paged pool's; what --kv-dtype would buy).
    prefix_cache_queries_total, prefix_cache_hits_total: prompt tokens looked up in
    the prefix cache and tokens served from it (hits / queries is the hit rate).
    mlx_active_memory_bytes, mlx_peak_memory_bytes: MLX's allocator, read when
    scraped.
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry

        def histogram(name: str, doc: str, buckets=LATENCY_BUCKETS) -> Histogram:
            return Histogram(PREFIX + name, doc, buckets=buckets, registry=r)

        self.ttft = histogram("time_to_first_token_seconds", "Arrival to first token.")
        self.itl = histogram("inter_token_latency_seconds", "Gap between tokens.")
        self.e2e = histogram("e2e_request_latency_seconds", "Arrival to finish.")
        self.queue_time = histogram(
            "request_queue_time_seconds", "Arrival to the first prefill chunk."
        )
        self.request_prompt_tokens = histogram(
            "request_prompt_tokens", "Prompt tokens per request.", TOKEN_BUCKETS
        )
        self.request_generation_tokens = histogram(
            "request_generation_tokens", "Generated tokens per request.", TOKEN_BUCKETS
        )
        self.prompt_tokens = Counter(
            PREFIX + "prompt_tokens", "Prompt tokens prefilled.", registry=r
        )
        self.generation_tokens = Counter(
            PREFIX + "generation_tokens", "Tokens generated for clients.", registry=r
        )
        self.prefill_chunks = Counter(
            PREFIX + "prefill_chunks", "Prefill chunks run.", registry=r
        )
        self.decode_steps = Counter(
            PREFIX + "decode_steps", "Decode steps run.", registry=r
        )
        self.engine_steps = Counter(
            PREFIX + "engine_steps", "Engine steps run.", registry=r
        )
        self.preemptions = Counter(
            PREFIX + "num_preemptions",
            "Requests preempted, to free KV blocks or for an interactive request "
            "(recomputed later).",
            registry=r,
        )
        self.spec_drafts = Counter(
            PREFIX + "spec_decode_num_drafts",
            "Decode rows that carried draft tokens.",
            registry=r,
        )
        self.spec_draft_tokens = Counter(
            PREFIX + "spec_decode_num_draft_tokens", "Draft tokens fed.", registry=r
        )
        self.spec_accepted_tokens = Counter(
            PREFIX + "spec_decode_num_accepted_tokens",
            "Draft tokens accepted.",
            registry=r,
        )
        self.request_success = Counter(
            PREFIX + "request_success",
            "Finished requests by finish reason.",
            ["finished_reason"],
            registry=r,
        )
        self.request_rejected = Counter(
            PREFIX + "request_rejected",
            "Requests refused before reaching the engine.",
            ["reason"],
            registry=r,
        )
        self.running = Gauge(
            PREFIX + "num_requests_running", "Requests in decode slots.", registry=r
        )
        self.waiting = Gauge(
            PREFIX + "num_requests_waiting",
            "Requests waiting or prefilling.",
            registry=r,
        )
        self.kv_cache_usage = Gauge(
            PREFIX + "kv_cache_usage_perc",
            "Decode slot positions in use (0-1).",
            registry=r,
        )
        self.kv_budget_tokens = Gauge(
            PREFIX + "kv_budget_tokens",
            "Tokens the KV cache can hold (paged: blocks x block size; dense: "
            "batch_size x max_seq_len).",
            registry=r,
        )
        self.kv_pool_bytes = Gauge(
            PREFIX + "kv_pool_bytes",
            "Bytes the paged KV pool's arrays hold now (0 for a dense cache).",
            registry=r,
        )
        self.kv_bytes_per_token = Gauge(
            PREFIX + "kv_bytes_per_token",
            "Bytes one token's keys and values take in the KV cache, by kv_dtype.",
            ["kv_dtype"],
            registry=r,
        )
        self.kv_budget_tokens_by_dtype = Gauge(
            PREFIX + "kv_budget_tokens_by_dtype",
            "Tokens the paged KV budget's bytes hold at each kv_dtype.",
            ["kv_dtype"],
            registry=r,
        )
        self.prefix_cache_queries = Counter(
            PREFIX + "prefix_cache_queries",
            "Prompt tokens looked up in the prefix cache.",
            registry=r,
        )
        self.prefix_cache_hits = Counter(
            PREFIX + "prefix_cache_hits",
            "Prompt tokens served from the prefix cache.",
            registry=r,
        )
        active = Gauge(
            PREFIX + "mlx_active_memory_bytes", "MLX active memory.", registry=r
        )
        active.set_function(mx.get_active_memory)
        peak = Gauge(PREFIX + "mlx_peak_memory_bytes", "MLX peak memory.", registry=r)
        peak.set_function(mx.get_peak_memory)
        for reason in ("stop", "length", "abort", "error"):
            self.request_success.labels(reason)
        for reason in ("bad_request", "busy", "unauthorized"):
            self.request_rejected.labels(reason)
