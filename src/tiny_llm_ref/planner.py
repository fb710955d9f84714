"""The planner: each step it decides what runs, and calls no model.

It owns the decode slots and the queue of waiting requests (prefilling, or
prefilled and waiting for a slot), and asks the KV manager for room. Two policies:
- "alternate" (week 2 days 6 and 7): plan_chunk() gives ONE chunk of the most urgent
  waiting request; then plan_decodes() gives every decoding request's next token.
  The engine runs them as two forwards.
- "mixed" (week 3 day 1): mixed_policy.plan_mixed(planner) gives both at once, for
  ONE forward: every decoding request first, so decodes never wait, then prefill
  chunks (most urgent first) within `token_budget` and the partial-prefill limits.

Urgency is a deadline: an interactive request's arrival, a batch request's arrival
plus batch_patience seconds; the earliest goes first, ties by the order added.

Rules both keep:
- A request starts prefilling only if it will have a slot when its prefill ends
  (slot_for), so no more requests prefill at once than there will be slots.
- A batch request never takes the slots reserved for interactive ones.
- Memory is reserved for the tokens a forward computes, just before it (the KV
  manager's reserve). When there is no room for a decode (a paged pool runs dry,
  week 3 day 2), the newest request holding memory is preempted: it gives its
  memory back and waits, first in line, to recompute. A prefill chunk with no room
  preempts only newer waiting requests, else it waits. Newest means batch before
  interactive, then the latest added (rank), so the oldest interactive request
  always goes on and nothing deadlocks.
"""

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from tiny_llm_base import EngineConfig, check_int
from tiny_llm_base.config_checks import is_adaptive

from .request import Request


@dataclass
class Plan:
    """What one forward runs.

    rows: the batch cache's rows fed, up to the highest slot in use: the decoding
        request in that slot, or None for an empty slot among them (a dummy row).
    chunks: (request, tokens): the request's next `tokens` prompt tokens, from its
        offset.
    mixed: run rows and chunks as one forward (week 3 day 1); else the plan holds
        either one chunk (try_prefill) or the rows (a decode forward).
    drafts: decoding request -> the draft tokens it feeds after its decode row, to
        be verified (week 3 day 4; mixed plans only).
    """

    rows: list[Request | None] = field(default_factory=list)
    chunks: list[tuple[Request, int]] = field(default_factory=list)
    mixed: bool = False
    drafts: dict[Request, list[int]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.rows or self.chunks)

    def decode_inputs(self) -> tuple[list[int], list[int]]:
        """The rows' tokens and offsets: each request's next_token at its offset, an
        empty slot's dummy row token 0 at offset 0."""
        # Week 2 Day 6: decode_inputs: next_token and offset of each row, 0 and 0 for
        # None
        tokens = [r.next_token if r else 0 for r in self.rows]
        offsets = [r.offset if r else 0 for r in self.rows]
        return tokens, offsets


class Planner:
    """Slots, the waiting queue, and the decisions.

    config: the engine's EngineConfig. kv: the KV manager (see kv_manager.py).
    slots: batch_size entries, the Request decoding in slot i or None.
    waiting: admitted requests neither in a slot nor finished, in admission order
        (a preempted request goes back to the front).
    order: each unfinished request's number, 0, 1, 2, ... in the order it was
        added. holding: the requests the KV manager holds memory for (preemption
        takes the newest by order). preemptions: how many so far.
    batch_slots: the slots batch requests may hold, batch_size -
        reserved_interactive_slots.
    """

    def __init__(self, config: EngineConfig, kv):
        # Week 2 Day 6: Planner: keep config and kv; batch_size empty slots, nothing
        # waiting, nothing ordered or holding, batch_slots, a counter for add,
        # preemptions 0
        self.config = config
        self.kv = kv
        self.slots: list[Request | None] = [None] * config.batch_size
        self.waiting: list[Request] = []
        self.order: dict[Request, int] = {}
        self.holding: set[Request] = set()
        self.batch_slots = config.batch_size - config.reserved_interactive_slots
        self.added = itertools.count()
        self.preemptions = 0

    def add(self, request: Request) -> None:
        """An arrived request waits for its prefill (its arrival time is read now if
        nobody read it)."""
        # Week 2 Day 6: add: append to waiting, give it the next number in order, read
        # metrics.arrival from request.clock() when it is None
        if request.metrics.arrival is None:
            request.metrics.arrival = request.clock()
        self.waiting.append(request)
        self.order[request] = next(self.added)

    def deadline(self, request: Request) -> float:
        """When the request should be served: an interactive request at its arrival,
        a batch one batch_patience seconds after its own. Earlier goes first."""
        # Week 2 Day 6: deadline: metrics.arrival, plus batch_patience for a batch
        # request
        patience = self.config.batch_patience if request.priority == "batch" else 0
        return request.metrics.arrival + patience

    def by_urgency(self) -> list[Request]:
        """The waiting requests, earliest deadline first, then the first added: an
        interactive request goes before the batch requests that arrived less than
        batch_patience seconds before it."""
        # Week 2 Day 6: by_urgency: waiting sorted by (deadline, order)
        return sorted(self.waiting, key=lambda r: (self.deadline(r), self.order[r]))

    def decoding(self) -> list[tuple[int, Request]]:
        """(slot, request) of every occupied slot, lowest slot first."""
        # Week 2 Day 6: decoding: (slot, request) of the occupied slots
        return [(slot, r) for slot, r in enumerate(self.slots) if r is not None]

    def slot_for(self, request: Request, also_ready: list[Request] = ()) -> int | None:
        """The lowest free slot this request may take, leaving one for each prefilled
        request and each in `also_ready` (their prefill ends this step); lowest first,
        so the batch cache's rows stay few. None for a batch request once batch
        requests, prefilled ones waiting for a slot included, hold batch_slots
        slots."""
        # Week 2 Day 6: slot_for: the free slots after leaving one per ready request;
        # None when there is none or a batch request would pass batch_slots
        free = [i for i, slot in enumerate(self.slots) if slot is None]
        if not free:  # before the waiting list: a long queue would cost its square
            return None
        ready = [
            r
            for r in self.waiting  # also_ready's requests are waiting too: count once
            if (r.is_prefill_done or r in also_ready) and r is not request
        ]
        free = free[len(ready) :]
        batch_held = sum(
            r.priority == "batch" for r in self.slots + ready if r is not None
        )
        if not free or (request.priority == "batch" and batch_held >= self.batch_slots):
            return None
        return free[0]

    def chunk_size(self, request: Request) -> int | None:
        """The next chunk's size for `request`, from prefill_step: an int or None as
        it is; an AdaptiveChunker: select_chunk_size(decoding, batch_size); any other
        function: prefill_step(prompt tokens, decoding, batch_size). `decoding` is
        the occupied slots now. A policy's answer that is not an int >= 1 (or None)
        raises (check_int)."""
        # Week 2 Day 6: chunk_size: prefill_step as it is, or asked (AdaptiveChunker or
        # function), checked with check_int
        policy = self.config.prefill_step
        if policy is None or isinstance(policy, int):
            return policy
        decoding = len(self.decoding())
        if is_adaptive(policy):
            size = policy.select_chunk_size(decoding, self.config.batch_size)
        else:
            size = policy(len(request.prefill_tokens), decoding, self.config.batch_size)
        check_int("the chunk size prefill_step chose", size, 1, allow_none=True)
        return size

    def admit(self, request: Request) -> bool:
        """Room for the request's prefill from the KV manager (True at once for a
        request already holding memory); it holds memory from then on, and moves
        past the prompt tokens the KV manager reports already cached (advance: the
        engine's one position write outside the model runner, because the chunks
        planned next start there)."""
        # Week 2 Day 6: admit: True for a holder; else kv.admit (None: False), and on
        # success it joins holding and advances by the cached tokens
        if request in self.holding:
            return True
        cached = self.kv.admit(request)
        if cached is None:
            return False
        request.advance(cached)
        self.holding.add(request)
        return True

    def prefill_candidates(
        self,
        also_ready: list[Request] = (),
        may_start: Callable[[Request], bool] | None = None,
    ) -> Iterator[Request]:
        """The waiting requests that may run a prefill chunk now, most urgent first:
        still prefilling, not a later choice whose first_choice is still prefilling
        (it waits to share that one's prompt), let start by `may_start` (week 3 day
        1's partial-prefill limits; None: everyone), with a slot in view (slot_for,
        with also_ready as it is when each is asked) and memory held or given
        (admit). First come, first served: once one cannot get memory, nobody behind
        it who holds none overtakes it, while those holding memory go on."""
        # Week 2 Day 6: prefill_candidates: by urgency, skip the prefilled, the later
        # choices whose first choice is neither prefilled nor finished, those
        # may_start refuses and those with no slot in view; admit the others until one
        # is refused, then only holders; yield each
        blocked = False
        for request in self.by_urgency():
            if request.is_prefill_done or (may_start and not may_start(request)):
                continue
            first = request.first_choice
            if first is not None and not (first.is_prefill_done or first.is_finished):
                continue
            if self.slot_for(request, also_ready) is None:
                continue
            if request not in self.holding and (blocked or not self.admit(request)):
                blocked = True
                continue
            yield request

    def plan_chunk(self) -> Plan:
        """The alternate policy's chunk: the most urgent waiting request that is still
        prefilling, will have a slot when done and gets room from the KV manager, with
        chunk_size(request) tokens (None: the rest of its prompt), as many as
        reserve_chunk makes room for (none: no chunk this step). Once one cannot
        get room, nobody behind it who holds none overtakes it. A policy's bad chunk
        size fails that request alone ("prefill failed: ...")."""
        # Week 2 Day 6: plan_chunk: the first of prefill_candidates(); its size, cut
        # to what reserve_chunk makes room for; Plan(chunks=[(request, size)]), or an
        # empty Plan when that is 0
        for request in self.prefill_candidates():
            try:
                size = self.chunk_size(request)
            except (TypeError, ValueError) as error:
                request.fail(f"prefill failed: {type(error).__name__}: {error}")
                self.retire_finished()
                return Plan()
            left = len(request.prefill_tokens) - request.offset
            size = self.reserve_chunk(request, min(left, size or left))
            return Plan(chunks=[(request, size)]) if size else Plan()
        return Plan()

    def plan_decodes(self) -> Plan:
        """The alternate policy's decode forward: room for every decoding request's
        next token (make_room_for_decodes), then the rows up to the highest slot in
        use."""
        # Week 2 Day 6: plan_decodes: make_room_for_decodes(), then
        # Plan(rows=decode_rows())
        self.make_room_for_decodes()
        return Plan(rows=self.decode_rows())

    def decode_rows(self) -> list[Request | None]:
        """The slots up to the highest in use (an empty one among them: None)."""
        # Week 2 Day 6: decode_rows: slots[: highest occupied slot + 1]
        active = self.decoding()
        return self.slots[: active[-1][0] + 1] if active else []

    # ANCHOR: make_room
    def make_room_for_decodes(self) -> None:
        """Before a decode forward: the KV manager grows every decoding request by
        its next token. While it cannot, the newest request holding memory is
        preempted (the request itself if it is that one)."""
        # Week 2 Day 6: make_room_for_decodes: while kv.reserve(request, 1) is 0 and the
        # request still decodes, preempt(newest_holder())
        for slot, request in self.decoding():
            while self.slots[slot] is request and not self.kv.reserve(request, 1):
                self.preempt(self.newest_holder())

    def rank(self, request: Request) -> tuple[bool, int]:
        """Higher is newer, preempted first: batch after interactive, then the
        order added."""
        # Week 2 Day 6: rank: (priority == "batch", order[request])
        return request.priority == "batch", self.order[request]

    def newest_holder(self) -> Request:
        """The request to preempt: the newest batch request holding memory, else the
        newest interactive one."""
        # Week 2 Day 6: newest_holder: max of holding by rank
        return max(self.holding, key=self.rank)

    def reserve_chunk(
        self, request: Request, size: int, planned: list[Request] = ()
    ) -> int:
        """Room for up to `size` tokens of the request's next chunk (kv.reserve):
        the tokens to feed. With none, waiting requests that hold memory, are newer
        (rank) and not in `planned` (chunks already in this step's plan) are
        preempted, newest first, until there is room or none is left (0: the
        request waits). A prefill never preempts an older request or a decode."""
        # Week 2 Day 6: reserve_chunk: while kv.reserve(request, size) is 0, preempt the
        # newest waiting holder ranked above the request and not planned; 0 when there
        # is none
        while not (room := self.kv.reserve(request, size)):
            newer = [
                r
                for r in self.holding
                if r in self.waiting
                and r not in planned
                and self.rank(r) > self.rank(request)
            ]
            if not newer:
                return 0
            self.preempt(max(newer, key=self.rank))
        return room

    def preempt(self, request: Request) -> None:
        """Take a request's memory back and make it wait again, first in line, to
        recompute its tokens (Request.restart)."""
        # Week 2 Day 6: preempt: leave(request), request.restart(), back to the front of
        # waiting, preemptions += 1
        self.leave(request)
        request.restart()
        self.waiting.insert(0, request)
        self.preemptions += 1

    # ANCHOR_END: make_room

    def place_prefilled(self) -> None:
        """Every prefilled waiting request, most urgent first, takes the slot
        slot_for gives it (the KV manager's place) and leaves waiting."""
        # Week 2 Day 6: place_prefilled: each prefilled waiting request by urgency takes
        # slot_for(request) through kv.place
        for request in self.by_urgency():
            slot = self.slot_for(request) if request.is_prefill_done else None
            if slot is None:
                continue
            self.kv.place(request, slot)
            self.slots[slot] = request
            self.waiting.remove(request)

    def leave(self, request: Request) -> None:
        """The request leaves its slot or the waiting queue, and gives its memory
        back (the KV manager's release)."""
        # Week 2 Day 6: leave: empty its slot (kv.remove) or take it out of waiting; if
        # it holds memory, kv.release it
        if request in self.slots:
            slot = self.slots.index(request)
            self.slots[slot] = None
            self.kv.remove(slot)
        elif request in self.waiting:
            self.waiting.remove(request)
        if request in self.holding:
            self.holding.remove(request)
            self.kv.release(request)

    def retire_finished(self) -> None:
        """Every finished request (stopped, failed, aborted) leaves (leave) and is
        forgotten."""
        # Week 2 Day 6: retire_finished: leave() and forget (order) every finished
        # request in the slots or waiting
        for request in self.slots + self.waiting:
            if request is not None and request.is_finished:
                self.leave(request)
                del self.order[request]
