"""Continuous batching with chunked prefill.

Every iteration of the loop does two things: one prefill chunk for the most urgent
waiting request, then one decode step that gives every decoding request its next
token. A request whose prefill is done takes a free decode slot at once, and a
finished request frees its slot for the next one. A long prompt therefore never
stalls the decoders for longer than one chunk.

Priorities: an interactive request's chunks go ahead of a batch request's remaining
chunks (the batch prefill pauses between chunks and resumes at its offset), and
batch requests never hold more than batch_size - reserved_interactive_slots decode
slots, so that the rest stay free for interactive requests.

A failure costs only the requests it touches: a failed prefill chunk fails its
request, a failed decode forward the requests in it, and the run goes on.
"""

import time
from collections.abc import Callable, Sequence

import mlx.core as mx

from tiny_llm_base import (
    BatchResults,
    PromptSpec,
    SchedulerSnapshot,
    SlotView,
    check_batch_arguments,
    greedy,
)

from .chunking import AdaptiveChunker
from .kv_cache import BatchingKvCache
from .metrics import RunMetrics
from .request import Request

ChunkPolicy = int | None | AdaptiveChunker | Callable[[int, int, int], int]


def batch_generate(
    model,
    tokenizer,
    prompts: Sequence[str | list[int] | PromptSpec],
    batch_size: int = 5,
    prefill_step: ChunkPolicy = 128,
    max_seq_len: int = 512,
    max_tokens: int | None = None,
    sampler: Callable[[mx.array], mx.array] | None = None,
    reserved_interactive_slots: int = 0,
    on_step: Callable[[SchedulerSnapshot], None] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> BatchResults:
    """Generate for every prompt, batch_size at a time; returns results in prompt order.

    prompts: a list of texts, token-id lists or PromptSpecs; a PromptSpec's
        max_tokens and sampler override the defaults given here (sampler default:
        greedy).
    batch_size: decode slots. The batch cache is one BatchingKvCache(batch_size,
        max_seq_len) per layer; count the layers as len(model.create_kv_cache()),
        since `model` may be a wrapper with only __call__, create_kv_cache,
        vocab_size and context_length.
    prefill_step: prompt tokens per prefill chunk; None prefills each prompt whole;
        or a policy asked before each chunk: a function called as
        policy(prompt tokens, requests in decode slots, batch_size), such as
        select_chunk_size, or an AdaptiveChunker, asked with
        select_chunk_size(requests in decode slots, batch_size) and told
        record(seconds) after the chunk.
    max_seq_len: positions per slot in the batch cache, at most
        model.context_length.
    reserved_interactive_slots: batch requests together never hold more than
        batch_size - reserved_interactive_slots decode slots, even when no
        interactive request is waiting (a prefilled batch request waiting for a slot
        counts as holding one). Interactive requests may take any free slot.
    on_step: called with a SchedulerSnapshot at the end of every iteration.
    clock: every time in the metrics is a reading of it. The scheduler reads a
        request's `arrival` when it admits it and its `prefill_start` just before its
        first chunk; the request reads a token's time when it accepts the token.

    Every iteration: admit the requests whose arrival_step equals the iterations
    done so far; run one prefill chunk of a waiting request that will find a slot
    (interactive first, then the first admitted); move every prefilled request into a
    free slot, the lowest first (add_request on every layer); run one decode step
    over the slots up to the highest in use, the batch cache's `rows` (an empty
    slot among them feeds token 0 at offset 0), freeing the slots of finished
    requests (remove_request on every layer); call on_step.

    Bad arguments raise TypeError (a wrong type; a bool is not an int) or
    ValueError naming the argument: check_batch_arguments checks them all and
    returns the prompts as PromptSpecs. A bad prompt or per-prompt setting fails
    that request alone (the Request checks it). A prefill that raises fails its
    request; a decode forward that raises fails every request in it and frees their
    slots; a sampler that fails fails its request (sample_and_accept). The run goes
    on with the others.
    """
    specs = check_batch_arguments(
        model,
        prompts,
        batch_size,
        prefill_step,
        max_seq_len,
        max_tokens,
        sampler,
        reserved_interactive_slots,
        on_step,
        clock,
    )
    requests = [
        Request(
            model,
            tokenizer,
            spec.prompt,
            prefill_max_step=None,  # chunk sizes come from Scheduler.chunk_size
            max_tokens=max_tokens if spec.max_tokens is None else spec.max_tokens,
            max_seq_len=max_seq_len,
            sampler=spec.sampler or sampler or greedy,
            priority=spec.priority,
            clock=clock,
        )
        for spec in specs
    ]
    scheduler = Scheduler(
        model,
        requests,
        [s.arrival_step for s in specs],
        batch_size,
        prefill_step,
        max_seq_len,
        reserved_interactive_slots,
        clock,
    )
    scheduler.run(on_step)
    results = BatchResults(r.result() for r in requests)
    results.metrics = scheduler.metrics
    return results


class Scheduler:
    """The state of one batch_generate run: waiting requests, decode slots, caches."""

    def __init__(
        self,
        model,
        requests,
        arrival_steps,
        batch_size,
        prefill_step,
        max_seq_len,
        reserved_interactive_slots,
        clock,
    ):
        self.model = model
        self.requests = requests
        self.arrival_steps = arrival_steps
        self.batch_size = batch_size
        self.prefill_step = prefill_step
        self.batch_slots = batch_size - reserved_interactive_slots
        self.clock = clock
        self.slots: list[Request | None] = [None] * batch_size
        self.waiting: list[Request] = []
        self.cache = [
            BatchingKvCache(batch_size, max_seq_len) for _ in model.create_kv_cache()
        ]
        self.metrics = RunMetrics()
        self.step = 0

    def run(self, on_step=None) -> None:
        mx.reset_peak_memory()
        start = self.clock()
        while not all(r.is_finished for r in self.requests):
            self.admit_arrivals()
            prefilled = self.prefill_one_chunk()
            self.move_prefilled_to_free_slots()
            self.decode_one_step()
            self.step += 1
            self.count_requests(start)
            if on_step:
                on_step(self.snapshot(prefilled))
        self.metrics.peak_memory_bytes = mx.get_peak_memory()

    def admit_arrivals(self) -> None:
        """Admit the requests whose arrival_step is the iterations done so far; their
        arrival time is read now."""
        for request, arrival in zip(self.requests, self.arrival_steps):
            if arrival == self.step:
                request.metrics.arrival = self.clock()
                # An invalid prompt has already finished with an error.
                if not request.is_finished:
                    self.waiting.append(request)

    def prefill_one_chunk(self) -> Request | None:
        """Run one chunk of the most urgent request that will have a slot when done."""
        candidates = [
            r
            for r in self.waiting
            if not r.is_prefill_done and self.slot_for(r) is not None
        ]
        if not candidates:
            return None
        # Interactive first; min is stable, so FIFO within a priority.
        request = min(candidates, key=lambda r: r.priority != "interactive")
        if request.metrics.prefill_start is None:
            request.metrics.prefill_start = self.clock()
        start = self.clock()
        try:
            tokens = request.try_prefill(self.chunk_size(request))
        except Exception as error:  # one bad request must not stop the others
            request.fail(f"prefill failed: {type(error).__name__}: {error}")
            self.waiting.remove(request)
            return None
        seconds = self.clock() - start
        self.metrics.record_prefill_chunk(tokens, seconds)
        request.metrics.prefill_chunks += 1
        if request.is_prefill_done:  # the last chunk sampled the first token
            self.metrics.generated_tokens += 1
        if isinstance(self.prefill_step, AdaptiveChunker):
            self.prefill_step.record(seconds)
        if request.is_finished:  # its first token was EOS, or max_tokens is 1
            self.waiting.remove(request)
        return request

    def chunk_size(self, request: Request) -> int | None:
        policy = self.prefill_step
        if policy is None or isinstance(policy, int):
            return policy
        decoding = sum(slot is not None for slot in self.slots)
        if isinstance(policy, AdaptiveChunker):
            return policy.select_chunk_size(decoding, self.batch_size)
        return policy(len(request.prefill_tokens), decoding, self.batch_size)

    def slot_for(self, request: Request) -> int | None:
        """The lowest free slot this request may take, leaving one for each prefilled
        request (lowest first, so the batch cache's rows stay few). None for a batch
        request once batch requests, prefilled ones waiting for a slot included, hold
        batch_size - reserved_interactive_slots slots."""
        ready = [r for r in self.waiting if r.is_prefill_done and r is not request]
        free = [i for i, slot in enumerate(self.slots) if slot is None][len(ready) :]
        batch_held = sum(
            r.priority == "batch" for r in self.slots + ready if r is not None
        )
        if not free or (request.priority == "batch" and batch_held >= self.batch_slots):
            return None
        return free[0]

    def move_prefilled_to_free_slots(self) -> None:
        for request in sorted(self.waiting, key=lambda r: r.priority != "interactive"):
            slot = self.slot_for(request) if request.is_prefill_done else None
            if slot is None:
                continue
            for layer_cache, request_cache in zip(self.cache, request.kv_cache):
                layer_cache.add_request(request_cache, slot)
            request.kv_cache = None  # its keys live in the batch cache now
            self.slots[slot] = request
            self.waiting.remove(request)

    def decode_one_step(self) -> None:
        """One token for every decoding request, in one forward over the cache's rows
        (up to the highest slot in use); an empty slot among them runs a dummy row."""
        active = [(slot, r) for slot, r in enumerate(self.slots) if r is not None]
        if not active:
            return
        start = self.clock()
        rows = self.slots[: active[-1][0] + 1]
        tokens = mx.array([[r.next_token if r else 0] for r in rows])
        offsets = [r.offset if r else 0 for r in rows]
        try:
            logits = self.model(tokens, offsets, self.cache)[:, -1, :]
            mx.eval(logits)
        except Exception as error:  # fails this forward's requests, not the run
            for slot, request in active:
                request.fail(f"decode step failed: {type(error).__name__}: {error}")
                self.free(slot)
            return
        for slot, request in active:
            request.offset += 1  # the token it was fed is in the cache now
            request.sample_and_accept(logits[slot : slot + 1])
            times = request.metrics.token_times
            if len(times) >= 2:
                self.metrics.longest_decode_stall = max(
                    self.metrics.longest_decode_stall, times[-1] - times[-2]
                )
            if request.is_finished:
                self.free(slot)
        self.metrics.record_decode_step(len(active), self.clock() - start)

    def free(self, slot: int) -> None:
        self.slots[slot] = None
        for layer_cache in self.cache:
            layer_cache.remove_request(slot)

    def count_requests(self, start: float) -> None:
        self.metrics.total_seconds = self.clock() - start
        self.metrics.running = sum(r is not None for r in self.slots)
        self.metrics.waiting = len(self.waiting)
        self.metrics.finished = sum(r.is_finished for r in self.requests)

    def snapshot(self, prefilled: Request | None) -> SchedulerSnapshot:
        index = {id(r): i for i, r in enumerate(self.requests)}
        views = [
            None
            if r is None
            else SlotView(
                index[id(r)], r.priority, r.offset, len(r.generated), r.text[-40:]
            )
            for r in self.slots
        ]
        prefilling = None
        if prefilled is not None and not prefilled.is_prefill_done:
            prefilling = (
                index[id(prefilled)],
                prefilled.offset,
                len(prefilled.prefill_tokens),
            )
        return SchedulerSnapshot(
            self.step,
            views,
            prefilling,
            self.metrics.finished,
            len(self.requests),
            self.metrics,
        )
