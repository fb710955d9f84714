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

A failure costs only the requests it touches: a failed forward fails the requests in
it, a failed sample the request it belongs to, and the engine goes on.

Day 6 writes the alternate policy with whole-prompt prefills (prefill_step=None) and
everything batch_generate needs; Day 7 adds chunk sizes, interactive-first and
reserved slots; Week 3 Day 1 adds the mixed policy and abort; Week 3 Day 2 the paged
KV cache (reserve_blocks, make_room_for_decodes, preempt, settle_blocks and the
`if self.paged` calls to them) and Day 3 prefix caching (cache_full_blocks).
"""

import itertools  # noqa: F401  (Engine.next_id)
import queue  # noqa: F401  (Engine.inbox)
import time
from collections.abc import Callable
from dataclasses import dataclass

import mlx.core as mx

# Infrastructure, not course material: given by tiny_llm_base.
from tiny_llm_base import (  # noqa: F401
    ForwardRecord,
    GenerationResult,
    PromptSpec,
    SchedulerSnapshot,
    SlotView,
    check_engine_arguments,
    check_kv_cache_arguments,
    greedy,
)

from .chunking import AdaptiveChunker
from .kv_cache import BatchingKvCache  # noqa: F401
from .metrics import RunMetrics  # noqa: F401
from .mixed_step import PrefillChunk, mixed_forward  # noqa: F401
from .paged_cache import (  # noqa: F401
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
        raise NotImplementedError(
            "Week 2 Day 6: Engine: check_engine_arguments (it raises for every bad "
            "setting), keep the settings (sampler or greedy; batch_slots = batch_size "
            "- reserved_interactive_slots), then the empty state of the class "
            "docstring: batch_size free slots, one BatchingKvCache per layer, an "
            "inbox queue, the id counter, the request lists, zero counters, a fresh "
            "RunMetrics, and mx.reset_peak_memory()"
        )

    def add_request(self, prompt: str | list[int] | PromptSpec) -> int:
        """Queue a prompt (any thread); returns its request id.

        A plain prompt is PromptSpec(prompt). The Request is made here, with
        prefill_max_step=None (the engine sizes every chunk, chunk_size), the spec's
        max_tokens and sampler or else the engine's, its priority, the engine's
        max_seq_len and clock: a bad one has already failed ("error") and finishes in
        the engine's next step, costing nobody else anything. Only a note goes into
        the inbox, ("add", id, request, arrival_step): the engine's thread reads it.
        """
        raise NotImplementedError(
            "Week 2 Day 6: add_request: make the Request (prefill_max_step=None, the "
            "spec's settings or the engine's), take the next id, put ('add', id, "
            "request, spec.arrival_step) in the inbox and return the id"
        )

    def abort(self, request_id: int) -> None:
        """Stop a request (any thread): within the next step it finishes with
        "abort" and frees its slot and cache, whether it waits, prefills or decodes.
        An unknown or finished id is ignored. Only a note goes into the inbox,
        ("abort", id, None, None): stop() does the work on the engine's thread."""
        raise NotImplementedError(
            "Week 3 Day 1: abort: put ('abort', request_id, None, None) in the inbox"
        )

    def has_unfinished(self) -> bool:
        """True while a request has not been reported finished, or a note waits in
        the inbox (a request just added counts before the engine has read it)."""
        raise NotImplementedError(
            "Week 2 Day 6: has_unfinished: any request in `ids`, or an inbox that is "
            "not empty"
        )

    def step(self) -> list[RequestOutput]:
        """One iteration: read the inbox, admit arrivals, run the policy's forward(s),
        and report what each request got.

        The clock is read into `started` at the first step. "alternate": prefilled =
        prefill_one_chunk(), move_prefilled_to_free_slots(), decode_one_step().
        "mixed": prefilled = run_mixed_step(). Paged: settle_blocks(). Then
        steps_done += 1, count_requests() and return collect_outputs().
        """
        raise NotImplementedError(
            "Week 2 Day 6: step: start the clock at the first step; read_inbox, "
            "admit_arrivals; the alternate policy: prefill_one_chunk (keep what it "
            "returns in `prefilled`), move_prefilled_to_free_slots, decode_one_step; "
            "count the step, count_requests, return collect_outputs(). Week 3 Day 1 "
            "adds the mixed policy: prefilled = run_mixed_step()"
        )

    def read_inbox(self) -> None:
        """Take every note out of the inbox. ("add", id, request, arrival_step):
        remember the id, 0 tokens reported, put it in `arriving`, count it in
        `added`. ("abort", id, ...): stop(id)."""
        raise NotImplementedError(
            "Week 2 Day 6: read_inbox: for each 'add' note: ids[request] = id, "
            "reported[request] = 0, append (arrival_step, request) to arriving, "
            "added += 1. Week 3 Day 1: an 'abort' note calls stop(id)"
        )

    def stop(self, request_id: int) -> None:
        """Abort a request now (the engine's thread): free its slot if it decodes,
        else take it out of `waiting` or `arriving`; then finish it with "abort". An
        id that is unknown, already reported or already finished is ignored."""
        raise NotImplementedError(
            "Week 3 Day 1: stop: find the request of this id (none, or finished: "
            "return); free its slot, or remove it from waiting, or from arriving; "
            "request.finish('abort')"
        )

    def admit_arrivals(self) -> None:
        """Admit the requests whose arrival_step the steps done so far have reached;
        their arrival time is read now. A request that has already failed (a bad
        prompt) gets its arrival time but does not wait."""
        raise NotImplementedError(
            "Week 2 Day 6: admit_arrivals: every request in arriving with "
            "arrival_step <= steps_done leaves it, gets metrics.arrival = clock(), "
            "and joins waiting unless it is already finished"
        )

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
        raise NotImplementedError(
            "Week 2 Day 6: prefill_one_chunk: the first waiting request still "
            "prefilling that slot_for places; prefill_start before its first chunk; "
            "time try_prefill(chunk_size(request)) (a raise fails it alone); "
            "report_forward, record_prefill_chunk, count its chunk, count the first "
            "token once its prefill is done; remove it from waiting if it finished. "
            "Day 6 prefills whole prompts (chunk_size None). Day 7: any chunk size, "
            "interactive requests first, AdaptiveChunker.record(seconds)"
        )

    def chunk_size(self, request: Request) -> int | None:
        """The next chunk's size for `request`, from prefill_step: an int or None as
        it is; an AdaptiveChunker: select_chunk_size(decoding, batch_size); any other
        function: prefill_step(prompt tokens, decoding, batch_size). `decoding` is
        the occupied slots now. A policy's answer that is not an int >= 1 (or None)
        raises (check_int)."""
        raise NotImplementedError(
            "Week 2 Day 6: chunk_size: an int or None prefill_step is the size "
            "(None: the whole rest). Day 7: an AdaptiveChunker's "
            "select_chunk_size(occupied slots, batch_size), or a function's "
            "prefill_step(len(prefill_tokens), occupied slots, batch_size)"
        )

    def slot_for(self, request: Request, also_ready: list[Request] = ()) -> int | None:
        """The lowest free slot this request may take, leaving one for each prefilled
        request and each in `also_ready` (their prefill ends this step); lowest first,
        so the batch cache's rows stay few. None for a batch request once batch
        requests, prefilled ones waiting for a slot included, hold
        batch_size - reserved_interactive_slots slots."""
        raise NotImplementedError(
            "Week 2 Day 6: slot_for: the free slots, lowest first, minus one for "
            "every other request that is prefilled and waiting (or in also_ready): "
            "the first left, or None. Day 7: None for a batch request while batch "
            "requests in slots or prefilled and waiting already hold batch_slots"
        )

    def move_prefilled_to_free_slots(self) -> None:
        """Every prefilled waiting request, interactive first, takes the slot
        slot_for gives it: add_request(its cache, slot) on every layer's batch cache;
        its own kv_cache is dropped (None) and it leaves waiting."""
        raise NotImplementedError(
            "Week 2 Day 6: move_prefilled_to_free_slots: for each waiting request "
            "whose prefill is done and that slot_for places: add_request on every "
            "layer, kv_cache = None, slots[slot] = request, leave waiting"
        )

    def decoding(self) -> list[tuple[int, Request]]:
        """(slot, request) of every occupied slot, lowest slot first."""
        raise NotImplementedError(
            "Week 2 Day 6: decoding: (slot, request) for every slot that is not None"
        )

    def decode_inputs(self, active: list[tuple[int, Request]]):
        """Tokens and offsets of the cache's rows, up to the highest slot in use; an
        empty slot among them runs a dummy row (token 0 at offset 0)."""
        raise NotImplementedError(
            "Week 2 Day 6: decode_inputs: for slots 0 .. the highest in `active`, "
            "each request's next_token and offset, 0 and 0 for an empty slot"
        )

    def decode_one_step(self) -> None:
        """One token for every decoding request, in one forward over the cache's rows.

        Paged: make_room_for_decodes() first (it may preempt). Nothing to do with every
        slot free. Timed from before decode_inputs to after accept_decoded: model(tokens
        [R, 1], offsets, cache) -> the last position's logits [R, V], evaluated
        (mx.eval) inside the try; a raise fails the forward's requests (fail_forward).
        Then accept_decoded, report_forward(start, seconds, [], the requests) and
        metrics.record_decode_step(requests, seconds).
        """
        raise NotImplementedError(
            "Week 2 Day 6: decode_one_step: with requests in slots: read the clock, "
            "decode_inputs, run the model on tokens [R, 1] at the offsets with the "
            "batch cache, take and mx.eval the last position's logits (a raise: "
            "fail_forward, return); accept_decoded; report_forward and "
            "record_decode_step with the time"
        )

    def accept_decoded(self, active: list[tuple[int, Request]], logits: mx.array):
        """logits: [rows, V]: each decoding request samples its row.

        For each (slot, request): offset += 1 (its fed token is in the cache now),
        sample_and_accept(logits[slot : slot + 1]); the gap between its last two
        token times raises metrics.longest_decode_stall if longer; a request that
        finished frees its slot."""
        raise NotImplementedError(
            "Week 2 Day 6: accept_decoded: per decoding request: offset += 1, "
            "sample_and_accept its row, update longest_decode_stall from its last "
            "two token_times, free its slot if it finished"
        )

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
        raise NotImplementedError(
            "Week 3 Day 1: run_mixed_step: budget = token_budget - decodes; "
            "plan_chunks(budget); one mixed_forward of the decode rows and the chunks "
            "(mx.eval inside the try; a raise: fail_forward with both); advance each "
            "chunk's request, sample a finishing chunk's first token, accept_decoded; "
            "report_forward, record_mixed_step; move_prefilled_to_free_slots; return "
            "the first planned request still prefilling"
        )

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
        raise NotImplementedError(
            "Week 3 Day 1: plan_chunks: walk the waiting requests still prefilling, "
            "interactive first; skip one slot_for(request, ending) cannot place; cut "
            "a PrefillChunk of min(left, chunk_size or left, budget) tokens at its "
            "offset with its kv_cache (wants_logits when it ends the prompt: add it "
            "to ending); take its length off the budget, stop at 0"
        )

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
        raise NotImplementedError(
            "Week 2 Day 6: report_forward: if on_forward is set, call it with a "
            "ForwardRecord of the start, the end, the chunks as (id, tokens) and the "
            "decodes as ids"
        )

    def fail_forward(
        self, error: Exception, active: list[tuple[int, Request]], prefilling: list
    ) -> None:
        """A forward raised: every request in it fails with "forward failed:
        <ErrorType>: <error>"; the decoding ones free their slots, the prefilling ones
        (the mixed step's chunks) leave waiting."""
        raise NotImplementedError(
            "Week 2 Day 6: fail_forward: fail each request in `active` and free its "
            "slot; fail each in `prefilling` and remove it from waiting; the message "
            "is 'forward failed: ' + the error's type name + ': ' + the error"
        )

    def free(self, slot: int) -> None:
        """The slot is empty again: remove_request(slot) on every layer's cache."""
        raise NotImplementedError(
            "Week 2 Day 6: free: slots[slot] = None and remove_request(slot) on "
            "every layer"
        )

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
        raise NotImplementedError(
            "Week 3 Day 2: reserve_blocks: True if the request holds a table already; "
            "else a new BlockTable (day 3: pool.lookup(prefill_tokens[:-1]) when "
            "prefix_caching), the blocks still missing for all prefill_tokens "
            "(blocks_needed), False after releasing the looked-up ones if the pool "
            "has too few available; else allocate them, keep the table in `tables`, "
            "offset = the cached blocks' tokens, kv_cache = a PagedKvCache per layer "
            "at that offset (day 3: at the first admission count cached_tokens and "
            "record_prefix_lookup)"
        )

    def first_with_blocks(self, candidates: list[Request]) -> Request | None:
        """The first candidate that holds its blocks or gets them (reserve_blocks).
        Once one cannot get them, the candidates after it that hold none are passed
        over too: nobody overtakes it, yet those holding blocks go on."""
        raise NotImplementedError(
            "Week 3 Day 2: first_with_blocks: go through the candidates in order; "
            "return the first that is in `tables`, or, while no reservation has "
            "failed yet, the first for which reserve_blocks succeeds; after a failure "
            "only holders may still be returned; None if none"
        )

    def make_room_for_decodes(self) -> None:
        """Before a decode forward (paged): a decoding request whose next token starts
        a new block gets one. While the pool has none, the newest request holding
        blocks is preempted (vLLM's policy; batch before interactive), the request
        itself if it is that one. The oldest interactive request (the oldest batch
        one when no interactive request holds blocks) always goes on, so nothing
        deadlocks."""
        raise NotImplementedError(
            "Week 3 Day 2: make_room_for_decodes: settle_blocks(); then for every "
            "decoding request still in its slot whose offset has reached the end of "
            "its blocks: while the pool has no block available and the request still "
            "holds its table, preempt(newest_holder()); if it still holds its table, "
            "append pool.allocate(1)"
        )

    def newest_holder(self) -> Request:
        """The request to preempt: the newest batch request holding blocks, else the
        newest interactive one."""
        raise NotImplementedError(
            "Week 3 Day 2: newest_holder: max over `tables` by (priority == 'batch', "
            "request id)"
        )

    def preempt(self, request: Request) -> None:
        """Take a request's blocks back and make it wait again, first in line, to
        recompute them: its prefill_tokens become its prompt and the tokens it
        generated, offset 0, and the prefill's last chunk samples its next token."""
        raise NotImplementedError(
            "Week 3 Day 2: preempt: (day 3: cache_full_blocks first) release its "
            "table's blocks; free its slot or take it out of waiting; prefill_tokens "
            "= its prompt (the first metrics.prompt_tokens) + generated; offset 0, "
            "next_token and kv_cache None; count the preemption in its metrics and "
            "the run's; insert it first in waiting"
        )

    def settle_blocks(self) -> None:
        """After a step's forwards: with prefix caching, name every request's newly
        filled blocks (cache_full_blocks); a finished request gives its blocks back."""
        raise NotImplementedError(
            "Week 3 Day 2: settle_blocks: for every request in `tables` (day 3: "
            "cache_full_blocks when prefix_caching), a finished one's blocks go back "
            "(pool.release) and it leaves `tables`"
        )

    def cache_full_blocks(self, request: Request) -> None:
        """Name each full block of the request not named yet: chain_hash(the previous
        block's hash, its tokens), then pool.remember(block, hash). Its tokens are
        its prompt and then the tokens it generated; `offset` says how many are in
        the cache."""
        raise NotImplementedError(
            "Week 3 Day 3: cache_full_blocks: for each block index from "
            "len(table.hashes) up to offset // block_size: chain_hash(the last hash "
            "or None, the block's tokens of prompt + generated), append it to "
            "table.hashes and pool.remember(block, hash)"
        )

    # ANCHOR_END: paged

    def count_requests(self) -> None:
        """At the end of a step: metrics.total_seconds (clock - started), running
        (occupied slots), waiting (len(waiting)), finished (added minus the requests
        in `ids` not finished yet) and peak_memory_bytes (mx.get_peak_memory()).
        Paged: metrics.record_blocks(pool.in_use, len(pool.cached),
        kv_bytes_per_token())."""
        raise NotImplementedError(
            "Week 2 Day 6: count_requests: total_seconds, running, waiting, "
            "finished and peak_memory_bytes as the docstring says"
        )

    def kv_bytes_per_token(self) -> int:
        """Bytes of keys and values one token takes over all layers (0 before the
        pool's arrays exist)."""
        raise NotImplementedError(
            "Week 3 Day 2: kv_bytes_per_token: over the layers whose pool exists, "
            "(keys.nbytes + values.nbytes) // (num_blocks * block_size), summed"
        )

    def collect_outputs(self) -> list[RequestOutput]:
        """A RequestOutput for every request that accepted a token or finished this
        step: its new tokens (generated past `reported`), the detokenizer's
        last_segment as text ("" without a detokenizer) and its finish_reason. A
        finished request's output carries result() and the engine forgets it (out
        of ids and reported)."""
        raise NotImplementedError(
            "Week 2 Day 6: collect_outputs: for each request in ids with new "
            "tokens or finished: RequestOutput(id, new tokens, last_segment, "
            "finish_reason), advance reported; a finished one gets result() and "
            "leaves ids and reported"
        )

    def snapshot(self) -> SchedulerSnapshot:
        """The slots, the request prefilling and the counters, for live views:
        SchedulerSnapshot(steps_done, a SlotView(id, priority, offset,
        len(generated), text[-40:]) per occupied slot and None per free one,
        (id, offset, prompt tokens) of `prefilled` while its prefill is not done else
        None, metrics.finished, added, metrics)."""
        raise NotImplementedError(
            "Week 2 Day 6: snapshot: a SchedulerSnapshot of steps_done, the slots as "
            "SlotViews, `prefilled` if still prefilling, finished, added and metrics"
        )
