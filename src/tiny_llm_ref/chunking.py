"""How many prompt tokens to prefill in the next chunk.

A small chunk lets decoding requests take a step sooner (short stalls) but pays the
per-call overhead more often; a large chunk is efficient but stalls every decoding
request while it runs. `batch_generate` takes a fixed `prefill_step`, None for no
chunking, `select_chunk_size`, or an `AdaptiveChunker`.
"""

from collections import deque


def select_chunk_size(
    sequence_length: int, active_decode_requests: int, batch_size: int
) -> int:
    """A static policy: protect decoders when most slots decode, else favour efficiency.

    - more than 80% of the slots decoding: 64 tokens, so no decoder waits long;
    - a prompt longer than 2048 tokens: 256 tokens, fewer passes over the weights;
    - otherwise the balanced default of 128.
    """
    # Week 2 Day 7 Task 1: select_chunk_size: 64 when active_decode_requests > 0.8 *
    # batch_size, else 256 for prompts longer than 2048 tokens, else 128
    if active_decode_requests > 0.8 * batch_size:
        return 64
    if sequence_length > 2048:
        return 256
    return 128


class AdaptiveChunker:
    """A chunk size that follows measured chunk times.

    Under decode pressure (active_decode_requests / batch_size strictly above
    `pressure_threshold`) the size halves, whatever the times; otherwise, while the
    mean of the times recorded since the last change (at most the last `window`;
    one is enough) stays under `decode_latency_target` it doubles, and when it is
    over it halves; exactly at the target, or with no time recorded, it stays.
    Halving is integer division. The size stays in [min_chunk_size,
    max_chunk_size]; only when the clamped size differs from the current one are
    the recorded times forgotten. Each select_chunk_size call is one decision (it
    changes the state): call it once per chunk. Only the sizes are checked.

    State: chunk_size, the current size (initial_chunk_size at first), and
    recent_chunk_times, a deque(maxlen=window) of the recorded times.
    """

    def __init__(
        self,
        initial_chunk_size: int = 128,
        min_chunk_size: int = 32,
        max_chunk_size: int = 512,
        decode_latency_target: float = 0.05,
        pressure_threshold: float = 0.8,
        window: int = 4,
    ) -> None:
        # Week 2 Day 7 Task 2: AdaptiveChunker: check 1 <= min_chunk_size <=
        # initial_chunk_size <= max_chunk_size (ValueError otherwise), keep the
        # settings, the current chunk size and the last `window` chunk times
        if not 1 <= min_chunk_size <= initial_chunk_size <= max_chunk_size:
            raise ValueError(
                "AdaptiveChunker needs 1 <= min_chunk_size <= initial_chunk_size <= max_chunk_size, got "
                f"{min_chunk_size}, {initial_chunk_size}, {max_chunk_size}"
            )
        self.chunk_size = initial_chunk_size
        self.min_chunk_size = min_chunk_size
        self.max_chunk_size = max_chunk_size
        self.decode_latency_target = decode_latency_target
        self.pressure_threshold = pressure_threshold
        self.recent_chunk_times: deque[float] = deque(maxlen=window)

    def record(self, seconds: float) -> None:
        """Report how long the last chunk took."""
        # Week 2 Day 7 Task 2: AdaptiveChunker.record: remember the chunk time (only the
        # last `window` count)
        self.recent_chunk_times.append(seconds)

    def select_chunk_size(self, active_decode_requests: int, batch_size: int) -> int:
        """The next chunk's size, given how many of the batch_size slots are decoding."""
        # Week 2 Day 7 Task 2: AdaptiveChunker.select_chunk_size: halve under decode
        # pressure, else double while the mean recent chunk time is under the target and
        # halve when it is over; clamp to [min, max]; forget the old times when the size
        # changes
        pressure = active_decode_requests / batch_size
        size = self.chunk_size
        if pressure > self.pressure_threshold:
            size //= 2
        elif self.recent_chunk_times:
            mean = sum(self.recent_chunk_times) / len(self.recent_chunk_times)
            if mean < self.decode_latency_target:
                size *= 2
            elif mean > self.decode_latency_target:
                size //= 2
        size = min(self.max_chunk_size, max(self.min_chunk_size, size))
        if size != self.chunk_size:
            # Times measured at the old size say nothing about the new one.
            self.recent_chunk_times.clear()
            self.chunk_size = size
        return size
