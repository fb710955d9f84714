"""What a command says about a running engine: its KV cache's size once built, and
every LOG_INTERVAL seconds a line of throughput and queue sizes."""

import time

LOG_INTERVAL = 2.0  # seconds between engine lines, like vLLM's periodic stats


def kv_cache_line(
    metrics,
    model,
    batch_size: int,
    max_seq_len: int,
    kv_memory: int | None = None,
    num_blocks: int | None = None,
    source: str | None = None,
    kv_dtype: str = "float32",
) -> str:
    """How many tokens the engine's KV cache holds, said once it is built: a paged
    pool's budget in bytes, tokens and blocks (from the engine's `metrics`), or a
    dense cache's batch_size x max_seq_len. The bytes a token are the model's, at
    kv_dtype (a quantized pool's are fewer, so the same budget holds more tokens).
    source: what sized the pool, when not kv_memory, num_blocks or the default."""
    from tiny_llm_base.memory import format_bytes, kv_bytes_per_token, tokens_by_dtype

    per_token = kv_bytes_per_token(model, kv_dtype)
    at = f" at {per_token:,} bytes a token" if per_token else ""
    if metrics.kv_blocks_total:
        blocks, size = metrics.kv_blocks_total, metrics.kv_block_size
        tokens = blocks * size
        fits = tokens_by_dtype(model, kv_memory or tokens * (per_token or 0), size)
        if kv_dtype != "float32":
            at += f" ({kv_dtype}"
            if fits.get("float32"):
                at += f": {tokens / fits['float32']:.1f}x float32's {fits['float32']:,}"
            at += ")"
        if kv_memory is not None:
            budget = f"budget {format_bytes(kv_memory)} = "
        elif per_token:
            source = source or (
                "--num-blocks" if num_blocks else "half the available memory"
            )
            budget = f"budget {format_bytes(tokens * per_token)} ({source}) = "
        else:
            budget = ""
        return (
            f"KV cache: paged, {budget}{tokens:,} tokens ({blocks:,} blocks of "
            f"{size}){at}; the pool grows as it is used"
        )
    tokens = metrics.kv_dense_tokens or batch_size * max_seq_len
    full = f" ({format_bytes(tokens * per_token)} when full)" if per_token else ""
    return (
        f"KV cache: dense, batch_size x max_seq_len = {batch_size} x {max_seq_len} "
        f"= {tokens:,} tokens{at}{full}"
    )


def step_time(metrics) -> str:
    """The mixed policy's average step time, or the alternate policy's chunk time
    (its moving average), for the engine log line."""
    if metrics.mixed_steps:
        return f"step avg: {1000 * metrics.mixed_seconds / metrics.mixed_steps:.0f} ms"
    return f"chunk avg: {1000 * metrics.chunk_time_average:.0f} ms"


class EngineLog:
    """Every LOG_INTERVAL seconds, one line of throughput over the interval and queue
    sizes, in the style of vLLM's engine log."""

    def __init__(self, write) -> None:
        self.write = write
        self.last_time = time.perf_counter()
        self.last_prompt_tokens = 0
        self.last_generated_tokens = 0

    def update(self, snapshot, force: bool = False) -> None:
        now = time.perf_counter()
        elapsed = now - self.last_time
        if elapsed < LOG_INTERVAL and not force:
            return
        metrics = snapshot.metrics
        prompt_rate = (metrics.prefill_tokens - self.last_prompt_tokens) / elapsed
        generation_rate = (
            metrics.generated_tokens - self.last_generated_tokens
        ) / elapsed
        self.write(
            f"Avg prompt throughput: {prompt_rate:.1f} tokens/s, "
            f"Avg generation throughput: {generation_rate:.1f} tokens/s, "
            f"Running: {metrics.running} reqs, Waiting: {metrics.waiting} reqs, "
            f"Finished: {snapshot.finished}/{snapshot.total}, "
            f"{step_time(metrics)}, "
            f"longest stall: {1000 * metrics.longest_decode_stall:.0f} ms"
        )
        self.last_time = now
        self.last_prompt_tokens = metrics.prefill_tokens
        self.last_generated_tokens = metrics.generated_tokens
