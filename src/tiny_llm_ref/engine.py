"""The engine: requests come and go while it runs, and each `step()` moves every one
of them forward.

It owns the decode slots (a BatchingKvCache per layer) and the queue of requests
waiting to prefill. Other threads may call `add_request` and `abort` at any time:
both only leave a note in an inbox, which the engine's own thread reads at the start
of its next step, so the model and the caches are only ever touched by that thread.

Two policies decide what one step runs:
- "alternate" (week 2, days 6 and 7): one prefill chunk of the most urgent waiting
  request, then one decode forward for every decoding request: two forwards a step.
- "mixed" (week 3, day 1): ONE forward a step. Every decoding request's next token
  goes in first, so decodes never wait; prefill chunks (interactive before batch,
  first come first served) fill what is left of `token_budget`.

The keys and values live in a dense cache (kv_cache="dense": a BatchingKvCache per
layer, each prefilling request its own TinyKvFullCache) or in a pool of blocks
(kv_cache="paged", week 3 day 2: paged_cache.py), where a request holds only the
blocks its tokens fill, a full pool preempts the newest request, and with prefix
caching (day 3) a prompt starts after the blocks an earlier prompt already computed.

A failure costs only the requests it touches: a failed forward fails the requests in
it, a failed sample the request it belongs to, and the engine goes on.
"""

import itertools
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass

import mlx.core as mx

from tiny_llm_base import (
    ForwardRecord,
    GenerationResult,
    PromptSpec,
    SchedulerSnapshot,
    SlotView,
    check_engine_arguments,
    check_int,
    check_kv_cache_arguments,
    greedy,
)

from .chunking import AdaptiveChunker
from .kv_cache import BatchingKvCache
from .metrics import RunMetrics
from .mixed_step import PrefillChunk, mixed_forward
from .paged_cache import (
    BlockPool,
    BlockTable,
    LayerBlocks,
    PagedBatchingKvCache,
    PagedKvCache,
    blocks_needed,
    chain_hash,
)
from .request import Request

ChunkPolicy = int | None | AdaptiveChunker | Callable[[int, int, int], int]


def is_adaptive(policy: ChunkPolicy) -> bool:
    """An AdaptiveChunker, or anything shaped like one (check_engine_arguments takes
    both)."""
    return hasattr(policy, "select_chunk_size")


@dataclass
class RequestOutput:
    """What one request got in one step.

    tokens: the ids it accepted this step (an EOS is not one of them); text: the text
    they completed (the detokenizer's new segment). finish_reason is None while it
    runs; once set, `result` holds the request's GenerationResult and the engine
    forgets the request.
    """

    request_id: int
    tokens: list[int]
    text: str
    finish_reason: str | None
    result: GenerationResult | None = None


class Engine:
    """Continuous batching with chunked prefill, online.

    batch_size decode slots of max_seq_len positions each. prefill_step: tokens per
    prefill chunk (None: whole prompts), or a policy (select_chunk_size, an
    AdaptiveChunker); with the "mixed" policy it caps one request's chunk per step.
    token_budget: the most tokens one mixed step runs (None: no limit); it must
    leave room for a prefill token beside one decode token per slot.
    max_tokens and sampler are defaults that a PromptSpec may override.
    on_forward: called with a ForwardRecord after every forward (for timelines).
    kv_cache: "dense" (the default: days 6-7 and week 3 day 1 need nothing more) or
    "paged" (week 3 day 2): a pool of num_blocks blocks of block_size positions
    (None: batch_size x max_seq_len positions, the dense cache's), shared by every
    request; prefix_caching (paged only, week 3 day 3) reuses full blocks whose
    tokens an earlier request computed.

    The state (set by __init__, after check_engine_arguments and
    check_kv_cache_arguments):
    - the settings as given, sampler defaulting to greedy; batch_slots: the slots
      batch requests may hold, batch_size - reserved_interactive_slots.
    - slots: batch_size entries, the Request decoding in slot i or None.
    - cache: one BatchingKvCache(batch_size, max_seq_len) per layer; count the
      layers as len(model.create_kv_cache()).
    - inbox: a queue.SimpleQueue of notes from add_request and abort;
      next_id: itertools.count(), the request ids 0, 1, 2, ...
    - ids: request -> id, for every request read from the inbox and not yet
      reported finished; reported: request -> how many of its tokens an output
      already carried.
    - arriving: (arrival_step, request) of requests read but not admitted yet;
      waiting: admitted requests neither in a slot nor finished (prefilling, or
      prefilled and waiting for a slot), in admission order.
    - added: requests read from the inbox so far; steps_done: steps completed;
      started: the clock at the start of the first step (None before);
      prefilled: the request whose prefill chunk ran in the latest step (snapshot).
    - metrics: the RunMetrics, kv_dense_tokens = batch_size x max_seq_len; the
      peak memory is reset (mx.reset_peak_memory()).
    - paged: kv_cache == "paged"; block_size; prefix_caching: paged and
      prefix_caching; tables: request -> its BlockTable, for every request holding
      blocks. Paged only: pool, a BlockPool(num_blocks, block_size); layer_blocks,
      a LayerBlocks per layer; cache holds a PagedBatchingKvCache(batch_size,
      max_seq_len) per layer instead; metrics.kv_blocks_total and kv_block_size.
      Dense: pool None, layer_blocks empty.
    """

    def __init__(
        self,
        model,
        tokenizer,
        batch_size: int = 5,
        max_seq_len: int = 512,
        prefill_step: ChunkPolicy = 128,
        policy: str = "alternate",
        token_budget: int | None = None,
        max_tokens: int | None = None,
        sampler: Callable[[mx.array], mx.array] | None = None,
        reserved_interactive_slots: int = 0,
        clock: Callable[[], float] = time.perf_counter,
        on_forward: Callable[[ForwardRecord], None] | None = None,
        kv_cache: str = "dense",
        block_size: int = 16,
        num_blocks: int | None = None,
        prefix_caching: bool = True,
    ):
        check_engine_arguments(
            model,
            batch_size,
            prefill_step,
            max_seq_len,
            max_tokens,
            sampler,
            reserved_interactive_slots,
            clock,
            policy,
            token_budget,
        )
        check_kv_cache_arguments(
            kv_cache, block_size, num_blocks, prefix_caching, max_seq_len
        )
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.max_seq_len = max_seq_len
        self.prefill_step = prefill_step
        self.policy = policy
        self.token_budget = token_budget
        self.max_tokens = max_tokens
        self.sampler = sampler or greedy
        self.batch_slots = batch_size - reserved_interactive_slots
        self.clock = clock
        self.on_forward = on_forward
        self.slots: list[Request | None] = [None] * batch_size
        layers = len(model.create_kv_cache())
        self.paged = kv_cache == "paged"
        self.block_size = block_size
        self.prefix_caching = self.paged and prefix_caching
        self.tables: dict[Request, BlockTable] = {}  # the requests holding blocks
        if self.paged:
            num_blocks = num_blocks or batch_size * blocks_needed(
                max_seq_len, block_size
            )
            self.pool = BlockPool(num_blocks, block_size)
            self.layer_blocks = [
                LayerBlocks(num_blocks, block_size) for _ in range(layers)
            ]
            self.cache = [
                PagedBatchingKvCache(batch_size, max_seq_len) for _ in range(layers)
            ]
        else:
            self.pool, self.layer_blocks = None, []
            self.cache = [
                BatchingKvCache(batch_size, max_seq_len) for _ in range(layers)
            ]
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.next_id = itertools.count()
        self.ids: dict[Request, int] = {}  # every request not yet reported finished
        self.arriving: list[tuple[int, Request]] = []  # (arrival step, request)
        self.waiting: list[Request] = []
        self.reported: dict[Request, int] = {}  # tokens already in an output
        self.added = 0
        self.steps_done = 0
        self.started: float | None = None
        self.prefilled: Request | None = None
        self.metrics = RunMetrics()
        if self.paged:
            self.metrics.kv_blocks_total = num_blocks
            self.metrics.kv_block_size = block_size
        self.metrics.kv_dense_tokens = batch_size * max_seq_len
        mx.reset_peak_memory()

    def add_request(self, prompt: str | list[int] | PromptSpec) -> int:
        """Queue a prompt (any thread); returns its request id.

        A plain prompt is PromptSpec(prompt). The Request is made here, with
        prefill_max_step=None (the engine sizes every chunk, chunk_size), the spec's
        max_tokens and sampler or else the engine's, its priority, the engine's
        max_seq_len and clock: a bad one has already failed ("error") and finishes in
        the engine's next step, costing nobody else anything. Only a note goes into
        the inbox, ("add", id, request, arrival_step): the engine's thread reads it.
        """
        spec = prompt if isinstance(prompt, PromptSpec) else PromptSpec(prompt)
        check_int("arrival_step", spec.arrival_step, 0)
        request = Request(
            self.model,
            self.tokenizer,
            spec.prompt,
            prefill_max_step=None,  # the engine sizes every chunk (chunk_size)
            max_tokens=self.max_tokens if spec.max_tokens is None else spec.max_tokens,
            max_seq_len=self.max_seq_len,
            sampler=spec.sampler or self.sampler,
            priority=spec.priority,
            clock=self.clock,
        )
        request_id = next(self.next_id)
        self.inbox.put(("add", request_id, request, spec.arrival_step))
        return request_id

    def abort(self, request_id: int) -> None:
        """Stop a request (any thread): within the next step it finishes with
        "abort" and frees its slot and cache, whether it waits, prefills or decodes.
        An unknown or finished id is ignored. Only a note goes into the inbox,
        ("abort", id, None, None): stop() does the work on the engine's thread."""
        self.inbox.put(("abort", request_id, None, None))

    def has_unfinished(self) -> bool:
        """True while a request has not been reported finished, or a note waits in
        the inbox (a request just added counts before the engine has read it)."""
        return bool(self.ids) or not self.inbox.empty()

    # ANCHOR: step
    def step(self) -> list[RequestOutput]:
        """One iteration: read the inbox, admit arrivals, run the policy's forward(s),
        and report what each request got.

        The clock is read into `started` at the first step. "alternate": prefilled =
        prefill_one_chunk(), move_prefilled_to_free_slots(), decode_one_step().
        "mixed": prefilled = run_mixed_step(). Paged: settle_blocks(). Then
        steps_done += 1, count_requests() and return collect_outputs().
        """
        if self.started is None:
            self.started = self.clock()
        self.read_inbox()
        self.admit_arrivals()
        if self.policy == "mixed":
            self.prefilled = self.run_mixed_step()
        else:
            self.prefilled = self.prefill_one_chunk()
            self.move_prefilled_to_free_slots()
            self.decode_one_step()
        if self.paged:
            self.settle_blocks()
        self.steps_done += 1
        self.count_requests()
        return self.collect_outputs()

    # ANCHOR_END: step

    def read_inbox(self) -> None:
        """Take every note out of the inbox. ("add", id, request, arrival_step):
        remember the id, 0 tokens reported, put it in `arriving`, count it in
        `added`. ("abort", id, ...): stop(id)."""
        while not self.inbox.empty():
            action, request_id, request, arrival_step = self.inbox.get()
            if action == "add":
                self.ids[request] = request_id
                self.reported[request] = 0
                self.arriving.append((arrival_step, request))
                self.added += 1
            else:
                self.stop(request_id)

    def stop(self, request_id: int) -> None:
        """Abort a request now (the engine's thread): free its slot if it decodes,
        else take it out of `waiting` or `arriving`; then finish it with "abort". An
        id that is unknown, already reported or already finished is ignored."""
        request = next((r for r, i in self.ids.items() if i == request_id), None)
        if request is None or request.is_finished:
            return
        if request in self.slots:
            self.free(self.slots.index(request))
        elif request in self.waiting:
            self.waiting.remove(request)
        else:
            self.arriving = [(s, r) for s, r in self.arriving if r is not request]
        request.finish("abort")

    def admit_arrivals(self) -> None:
        """Admit the requests whose arrival_step the steps done so far have reached;
        their arrival time is read now. A request that has already failed (a bad
        prompt) gets its arrival time but does not wait."""
        arrived = [r for step, r in self.arriving if step <= self.steps_done]
        self.arriving = [(s, r) for s, r in self.arriving if s > self.steps_done]
        for request in arrived:
            request.metrics.arrival = self.clock()
            # An invalid prompt has already finished with an error.
            if not request.is_finished:
                self.waiting.append(request)

    def prefill_one_chunk(self) -> Request | None:
        """Run one chunk of the most urgent request that will have a slot when done;
        return it (None if no chunk ran or it failed).

        Candidates: waiting requests still prefilling for which slot_for is not None.
        Most urgent: interactive before batch, the first admitted within a priority.
        Paged: the most urgent that has or gets its blocks (first_with_blocks).
        Its prefill_start is read before its first chunk. The chunk:
        request.try_prefill(chunk_size(request)), timed with the clock just before
        and after; a raise fails that request alone ("prefill failed: ...") and
        removes it from waiting. Then report_forward(start, seconds,
        [(request, tokens)], []), metrics.record_prefill_chunk(tokens, seconds), the
        request's prefill_chunks += 1; the last chunk sampled the first token, so
        metrics.generated_tokens += 1; an AdaptiveChunker is told record(seconds);
        a request finished by its first token (EOS, max_tokens 1) leaves waiting.
        """
        candidates = [
            r
            for r in self.waiting
            if not r.is_prefill_done and self.slot_for(r) is not None
        ]
        if not candidates:
            return None
        # Interactive first; sorted is stable, so FIFO within a priority.
        candidates.sort(key=lambda r: r.priority != "interactive")
        request = self.first_with_blocks(candidates) if self.paged else candidates[0]
        if request is None:
            return None
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
        self.report_forward(start, seconds, [(request, tokens)], [])
        self.metrics.record_prefill_chunk(tokens, seconds)
        request.metrics.prefill_chunks += 1
        if request.is_prefill_done:  # the last chunk sampled the first token
            self.metrics.generated_tokens += 1
        if is_adaptive(self.prefill_step):
            self.prefill_step.record(seconds)
        if request.is_finished:  # its first token was EOS, or max_tokens is 1
            self.waiting.remove(request)
        return request

    def chunk_size(self, request: Request) -> int | None:
        """The next chunk's size for `request`, from prefill_step: an int or None as
        it is; an AdaptiveChunker: select_chunk_size(decoding, batch_size); any other
        function: prefill_step(prompt tokens, decoding, batch_size). `decoding` is
        the occupied slots now. A policy's answer that is not an int >= 1 (or None)
        raises (check_int)."""
        policy = self.prefill_step
        if policy is None or isinstance(policy, int):
            return policy
        decoding = sum(slot is not None for slot in self.slots)
        if is_adaptive(policy):
            size = policy.select_chunk_size(decoding, self.batch_size)
        else:
            size = policy(len(request.prefill_tokens), decoding, self.batch_size)
        check_int("the chunk size prefill_step chose", size, 1, allow_none=True)
        return size

    def slot_for(self, request: Request, also_ready: list[Request] = ()) -> int | None:
        """The lowest free slot this request may take, leaving one for each prefilled
        request and each in `also_ready` (their prefill ends this step); lowest first,
        so the batch cache's rows stay few. None for a batch request once batch
        requests, prefilled ones waiting for a slot included, hold
        batch_size - reserved_interactive_slots slots."""
        ready = [
            r
            for r in self.waiting  # also_ready's requests are waiting too: count once
            if (r.is_prefill_done or r in also_ready) and r is not request
        ]
        free = [i for i, slot in enumerate(self.slots) if slot is None][len(ready) :]
        batch_held = sum(
            r.priority == "batch" for r in self.slots + ready if r is not None
        )
        if not free or (request.priority == "batch" and batch_held >= self.batch_slots):
            return None
        return free[0]

    def move_prefilled_to_free_slots(self) -> None:
        """Every prefilled waiting request, interactive first, takes the slot
        slot_for gives it: add_request(its cache, slot) on every layer's batch cache;
        its own kv_cache is dropped (None) and it leaves waiting."""
        for request in sorted(self.waiting, key=lambda r: r.priority != "interactive"):
            slot = self.slot_for(request) if request.is_prefill_done else None
            if slot is None:
                continue
            for layer_cache, request_cache in zip(self.cache, request.kv_cache):
                layer_cache.add_request(request_cache, slot)
            request.kv_cache = None  # its keys live in the batch cache now
            self.slots[slot] = request
            self.waiting.remove(request)

    def decoding(self) -> list[tuple[int, Request]]:
        """(slot, request) of every occupied slot, lowest slot first."""
        return [(slot, r) for slot, r in enumerate(self.slots) if r is not None]

    def decode_inputs(self, active: list[tuple[int, Request]]):
        """Tokens and offsets of the cache's rows, up to the highest slot in use; an
        empty slot among them runs a dummy row (token 0 at offset 0)."""
        rows = self.slots[: active[-1][0] + 1]
        tokens = [r.next_token if r else 0 for r in rows]
        offsets = [r.offset if r else 0 for r in rows]
        return tokens, offsets

    def decode_one_step(self) -> None:
        """One token for every decoding request, in one forward over the cache's rows.

        Paged: make_room_for_decodes() first (it may preempt). Nothing to do with every
        slot free. Timed from before decode_inputs to after accept_decoded: model(tokens
        [R, 1], offsets, cache) -> the last position's logits [R, V], evaluated
        (mx.eval) inside the try; a raise fails the forward's requests (fail_forward).
        Then accept_decoded, report_forward(start, seconds, [], the requests) and
        metrics.record_decode_step(requests, seconds).
        """
        if self.paged:
            self.make_room_for_decodes()
        active = self.decoding()
        if not active:
            return
        start = self.clock()
        tokens, offsets = self.decode_inputs(active)
        try:
            logits = self.model(mx.array(tokens)[:, None], offsets, self.cache)
            logits = logits[:, -1, :]
            mx.eval(logits)
        except Exception as error:  # fails this forward's requests, not the run
            self.fail_forward(error, active, [])
            return
        self.accept_decoded(active, logits)
        seconds = self.clock() - start
        self.report_forward(start, seconds, [], [r for _, r in active])
        self.metrics.record_decode_step(len(active), seconds)

    def accept_decoded(self, active: list[tuple[int, Request]], logits: mx.array):
        """logits: [rows, V]: each decoding request samples its row.

        For each (slot, request): offset += 1 (its fed token is in the cache now),
        sample_and_accept(logits[slot : slot + 1]); the gap between its last two
        token times raises metrics.longest_decode_stall if longer; a request that
        finished frees its slot."""
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

    def run_mixed_step(self) -> Request | None:
        """ONE forward: every decoding request's token, then chunks within budget.

        Paged: make_room_for_decodes() first (it may preempt). The chunk budget is
        token_budget - the decode rows fed, empty slots' dummy rows included (None: no
        limit); plan_chunks picks the chunks. Nothing to run: return None. The clock
        `start` is read once, before the forward: it is the prefill_start of a request
        whose first chunk this is. mixed_forward(model, decode tokens, offsets, the
        batch cache (None with no decodes), chunks), with its logits and every chunk's
        cache evaluated inside the try; a raise fails every request in the forward
        (fail_forward) and returns None. Then, per chunk: offset += its length, its
        prefill_chunks += 1; a chunk with logits samples the first token
        (sample_and_accept; metrics.generated_tokens += 1) and a request it finished
        leaves waiting. Then accept_decoded for the decodes; report_forward(start,
        seconds, [(request, chunk length)], decoding requests);
        metrics.record_mixed_step(chunk lengths, decodes, seconds); an AdaptiveChunker
        is told record(seconds) when a chunk ran; move_prefilled_to_free_slots().
        Returns the first planned request whose prefill is not done (the snapshot's
        `prefilling`), else None.
        """
        if self.paged:
            self.make_room_for_decodes()
        active = self.decoding()
        tokens, offsets = self.decode_inputs(active) if active else ([], [])
        # Every row fed counts, an empty slot's dummy row too.
        budget = None if self.token_budget is None else self.token_budget - len(tokens)
        planned = self.plan_chunks(budget)
        if not active and not planned:
            return None
        start = self.clock()
        for request, _ in planned:
            if request.metrics.prefill_start is None:
                request.metrics.prefill_start = start
        chunks = [chunk for _, chunk in planned]
        try:
            decode_logits, chunk_logits = mixed_forward(
                self.model, tokens, offsets, self.cache if active else None, chunks
            )
            cache_state = [
                array
                for chunk in chunks
                for layer in chunk.cache
                for array in (layer.keys, layer.values)
            ]
            mx.eval(decode_logits, chunk_logits, cache_state)
        except Exception as error:  # fails this forward's requests, not the run
            self.fail_forward(error, active, [r for r, _ in planned])
            return None
        for (request, chunk), logits in zip(planned, chunk_logits):
            request.offset += len(chunk.tokens)
            request.metrics.prefill_chunks += 1
            if logits is not None:  # the chunk ended the prompt
                request.sample_and_accept(logits)
                self.metrics.generated_tokens += 1
                if request.is_finished:
                    self.waiting.remove(request)
        if active:
            self.accept_decoded(active, decode_logits)
        seconds = self.clock() - start
        self.report_forward(
            start,
            seconds,
            [(r, len(c.tokens)) for r, c in planned],
            [r for _, r in active],
        )
        self.metrics.record_mixed_step(
            [len(c.tokens) for c in chunks], len(active), seconds
        )
        if planned and is_adaptive(self.prefill_step):
            self.prefill_step.record(seconds)
        self.move_prefilled_to_free_slots()
        return next((r for r, c in planned if not r.is_prefill_done), None)

    def plan_chunks(self, budget: int | None) -> list[tuple[Request, PrefillChunk]]:
        """This step's prefill chunks, most urgent first, until `budget` tokens are
        spent (None: no limit); a request starts only if it will have a slot.

        Waiting requests still prefilling, interactive before batch, the first
        admitted first within a priority; each gets a chunk of min(tokens left,
        chunk_size(request) or tokens left, budget left) at its offset, with its
        kv_cache; wants_logits when the chunk ends the prompt. Paged: a request needs
        its blocks (reserve_blocks) before its chunk; once one cannot get them, the
        requests after it that hold none wait too (nobody overtakes it), while those
        holding blocks go on. slot_for is asked with
        `also_ready` = the requests that have started prefilling (offset > 0) and
        those planned so far, so that each keeps a slot in view: no more requests
        prefill at once than there will be slots for them. An AdaptiveChunker is
        asked once a step (it learns from one time a step); a size a policy gets
        wrong (check_int) fails that request alone. Stop once the budget is spent.
        """
        planned: list[tuple[Request, PrefillChunk]] = []
        # A request that has started prefilling keeps a slot in view until it ends.
        holding = [r for r in self.waiting if r.offset > 0]
        # An AdaptiveChunker learns from one time a step, so it is asked once a step.
        step_size = None
        blocked = False  # a request could not get its blocks
        for request in sorted(self.waiting, key=lambda r: r.priority != "interactive"):
            if budget is not None and budget <= 0:
                break
            if request.is_prefill_done or self.slot_for(request, holding) is None:
                continue
            if self.paged and request not in self.tables:
                if blocked or not self.reserve_blocks(request):
                    blocked = True  # first come, first served: nobody overtakes it
                    continue
            try:
                if step_size is None or not is_adaptive(self.prefill_step):
                    step_size = self.chunk_size(request)
            except (TypeError, ValueError) as error:  # a policy's bad answer
                request.fail(f"prefill failed: {error}")
                self.waiting.remove(request)
                continue
            left = len(request.prefill_tokens) - request.offset
            size = min(left, step_size or left, left if budget is None else budget)
            start, end = request.offset, request.offset + size
            chunk = PrefillChunk(
                request.prefill_tokens[start:end],
                start,
                request.kv_cache,
                wants_logits=end == len(request.prefill_tokens),
            )
            planned.append((request, chunk))
            if request not in holding:
                holding.append(request)
            if budget is not None:
                budget -= size
        return planned

    def report_forward(
        self,
        start: float,
        seconds: float,
        chunks: list[tuple[Request, int]],
        decodes: list[Request],
    ) -> None:
        """With on_forward set, call it with ForwardRecord(start, start + seconds,
        [(id, prompt tokens) per chunk], [id per decode]): request ids, not
        Requests. Without on_forward: nothing."""
        if self.on_forward is not None:
            self.on_forward(
                ForwardRecord(
                    start,
                    start + seconds,
                    [(self.ids[r], tokens) for r, tokens in chunks],
                    [self.ids[r] for r in decodes],
                )
            )

    def fail_forward(
        self, error: Exception, active: list[tuple[int, Request]], prefilling: list
    ) -> None:
        """A forward raised: every request in it fails with "forward failed:
        <ErrorType>: <error>"; the decoding ones free their slots, the prefilling ones
        (the mixed step's chunks) leave waiting."""
        message = f"forward failed: {type(error).__name__}: {error}"
        for slot, request in active:
            request.fail(message)
            self.free(slot)
        for request in prefilling:
            request.fail(message)
            self.waiting.remove(request)

    def free(self, slot: int) -> None:
        """The slot is empty again: remove_request(slot) on every layer's cache."""
        self.slots[slot] = None
        for layer_cache in self.cache:
            layer_cache.remove_request(slot)

    # ANCHOR: paged
    def reserve_blocks(self, request: Request) -> bool:
        """Before a request's chunk (paged): give it the blocks its prefill needs, or
        return False (it waits) when the pool cannot. True at once for a request that
        holds its blocks already.

        With prefix caching, its prompt's longest chain of cached blocks comes first
        (pool.lookup, over all but the last token: that one is always computed, for
        the logits the request samples) and its prefill starts after them: offset =
        cached tokens, as are its PagedKvCaches' offsets. At its first admission
        (not after a preemption) its metrics.cached_tokens and the run's
        record_prefix_lookup count them. Blocks it cannot get: the chain's refcounts
        go back down (pool.release).
        """
        if request in self.tables:
            return True
        tokens = request.prefill_tokens
        table = BlockTable()
        if self.prefix_caching:
            table = self.pool.lookup(tokens[:-1])
        missing = blocks_needed(len(tokens), self.block_size) - len(table.blocks)
        if missing > self.pool.available:
            self.pool.release(table.blocks)
            return False
        cached = len(table.blocks) * self.block_size
        table.blocks += self.pool.allocate(missing)
        self.tables[request] = table
        request.offset = cached
        request.kv_cache = [
            PagedKvCache(layer, table, cached) for layer in self.layer_blocks
        ]
        if self.prefix_caching and request.metrics.preemptions == 0:
            request.metrics.cached_tokens = cached
            self.metrics.record_prefix_lookup(len(tokens), cached)
        return True

    def first_with_blocks(self, candidates: list[Request]) -> Request | None:
        """The first candidate that holds its blocks or gets them (reserve_blocks).
        Once one cannot get them, the candidates after it that hold none are passed
        over too: nobody overtakes it, yet those holding blocks go on."""
        blocked = False
        for request in candidates:
            if request in self.tables:
                return request
            if not blocked and self.reserve_blocks(request):
                return request
            blocked = True
        return None

    def make_room_for_decodes(self) -> None:
        """Before a decode forward (paged): a decoding request whose next token starts
        a new block gets one. While the pool has none, the newest request holding
        blocks is preempted (vLLM's policy; batch before interactive), the request
        itself if it is that one. The oldest interactive request (the oldest batch
        one when no interactive request holds blocks) always goes on, so nothing
        deadlocks."""
        self.settle_blocks()  # finished requests give their blocks back first
        for slot, request in self.decoding():
            if self.slots[slot] is not request:  # preempted for an older request
                continue
            table = self.tables[request]
            if request.offset < len(table.blocks) * self.block_size:
                continue
            while self.pool.available == 0 and request in self.tables:
                self.preempt(self.newest_holder())
            if request in self.tables:
                table.blocks += self.pool.allocate(1)

    def newest_holder(self) -> Request:
        """The request to preempt: the newest batch request holding blocks, else the
        newest interactive one."""
        return max(self.tables, key=lambda r: (r.priority == "batch", self.ids[r]))

    def preempt(self, request: Request) -> None:
        """Take a request's blocks back and make it wait again, first in line, to
        recompute them: its prefill_tokens become its prompt and the tokens it
        generated, offset 0, and the prefill's last chunk samples its next token."""
        if self.prefix_caching:
            self.cache_full_blocks(request)  # its blocks may still be there later
        self.pool.release(self.tables.pop(request).blocks)
        if request in self.slots:
            self.free(self.slots.index(request))
        else:
            self.waiting.remove(request)
        prompt = request.prefill_tokens[: request.metrics.prompt_tokens]
        request.prefill_tokens = prompt + request.generated
        request.offset = 0
        request.next_token = None
        request.kv_cache = None
        request.metrics.preemptions += 1
        self.metrics.preemptions += 1
        self.waiting.insert(0, request)

    def settle_blocks(self) -> None:
        """After a step's forwards: with prefix caching, name every request's newly
        filled blocks (cache_full_blocks); a finished request gives its blocks back."""
        for request in list(self.tables):
            if self.prefix_caching:
                self.cache_full_blocks(request)
            if request.is_finished:
                self.pool.release(self.tables.pop(request).blocks)

    def cache_full_blocks(self, request: Request) -> None:
        """Name each full block of the request not named yet: chain_hash(the previous
        block's hash, its tokens), then pool.remember(block, hash). Its tokens are
        its prompt and then the tokens it generated; `offset` says how many are in
        the cache."""
        table = self.tables[request]
        size = self.block_size
        full = request.offset // size
        if len(table.hashes) >= full:
            return
        prompt = request.prefill_tokens[: request.metrics.prompt_tokens]
        tokens = prompt + request.generated
        for index in range(len(table.hashes), full):
            parent = table.hashes[-1] if table.hashes else None
            block_hash = chain_hash(parent, tokens[index * size : (index + 1) * size])
            table.hashes.append(block_hash)
            self.pool.remember(table.blocks[index], block_hash)

    # ANCHOR_END: paged

    def count_requests(self) -> None:
        """At the end of a step: metrics.total_seconds (clock - started), running
        (occupied slots), waiting (len(waiting)), finished (added minus the requests
        in `ids` not finished yet) and peak_memory_bytes (mx.get_peak_memory()).
        Paged: metrics.record_blocks(pool.in_use, pool.peak_in_use,
        len(pool.cached), kv_bytes_per_token())."""
        self.metrics.total_seconds = self.clock() - self.started
        self.metrics.running = sum(r is not None for r in self.slots)
        self.metrics.waiting = len(self.waiting)
        self.metrics.finished = self.added - sum(not r.is_finished for r in self.ids)
        self.metrics.peak_memory_bytes = mx.get_peak_memory()
        if self.paged:  # after settle_blocks: finished requests hold nothing
            self.metrics.record_blocks(
                self.pool.in_use,
                self.pool.peak_in_use,
                len(self.pool.cached),
                self.kv_bytes_per_token(),
            )

    def kv_bytes_per_token(self) -> int:
        """Bytes of keys and values one token takes over all layers (0 before the
        pool's arrays exist)."""
        return sum(
            (layer.keys.nbytes + layer.values.nbytes)
            // (layer.num_blocks * layer.block_size)
            for layer in self.layer_blocks
            if layer.keys is not None
        )

    def collect_outputs(self) -> list[RequestOutput]:
        """A RequestOutput for every request that accepted a token or finished this
        step: its new tokens (generated past `reported`), the detokenizer's
        last_segment as text ("" without a detokenizer) and its finish_reason. A
        finished request's output carries result() and the engine forgets it (out
        of ids and reported)."""
        outputs = []
        for request, request_id in list(self.ids.items()):
            new = request.generated[self.reported[request] :]
            if not new and not request.is_finished:
                continue
            self.reported[request] += len(new)
            text = request.detokenizer.last_segment if request.detokenizer else ""
            output = RequestOutput(request_id, new, text, request.finish_reason)
            if request.is_finished:
                output.result = request.result()
                del self.ids[request], self.reported[request]
            outputs.append(output)
        return outputs

    def snapshot(self) -> SchedulerSnapshot:
        """The slots, the request prefilling and the counters, for live views:
        SchedulerSnapshot(steps_done, a SlotView(id, priority, offset,
        len(generated), text[-40:]) per occupied slot and None per free one,
        (id, offset, prompt tokens) of `prefilled` while its prefill is not done else
        None, metrics.finished, added, metrics)."""
        views = [
            None
            if r is None
            else SlotView(
                self.ids[r], r.priority, r.offset, len(r.generated), r.text[-40:]
            )
            for r in self.slots
        ]
        prefilling = None
        if self.prefilled is not None and not self.prefilled.is_prefill_done:
            prefilling = (
                self.ids[self.prefilled],
                self.prefilled.offset,
                len(self.prefilled.prefill_tokens),
            )
        return SchedulerSnapshot(
            self.steps_done,
            views,
            prefilling,
            self.metrics.finished,
            self.added,
            self.metrics,
        )
