"""The planner: the mechanism every policy plans with; it decides nothing and calls
no model.

It owns the decode slots and the queue of waiting requests (prefilling, or
prefilled and waiting for a slot), and asks the KV manager for memory: admission
(admit), room for a forward's tokens (reserve), placement in a slot when a prefill
ends (place_prefilled), and leaving (leave, retire_finished, requeue). A policy
(policy.py: alternate, week 2 days 6 and 7; mixed_policy.py: mixed, week 3 day 1)
decides what each step runs with it, and preemption.py decides whom to preempt
when there is no room.

Urgency is a deadline: an interactive request's arrival, a batch request's arrival
plus batch_patience seconds; the earliest goes first, ties by the order added.

Rules every policy keeps, because they live here:
- A request starts prefilling only if it will have a slot when its prefill ends
  (slot_for), so no more requests prefill at once than there will be slots.
- A batch request never takes the slots reserved for interactive ones.
- First come, first served for memory: once one request cannot be admitted, nobody
  behind it who holds no memory overtakes it (prefill_candidates).
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
        # Week 2 Day 6 Task 2: decode_inputs: next_token and offset of each row, 0 and 0
        # for None
        tokens = [r.next_token if r else 0 for r in self.rows]
        offsets = [r.offset if r else 0 for r in self.rows]
        return tokens, offsets


class Planner:
    """Slots, the waiting queue and memory: the mechanism the policies plan with.

    config: the engine's EngineConfig. kv: the KV manager (see kv_manager.py).
    slots: batch_size entries, the Request decoding in slot i or None.
    waiting: admitted requests neither in a slot nor finished, in admission order
        (a preempted request goes back to the front).
    order: a dict, each unfinished request -> its number, 0, 1, 2, ... in the
        order it was added (an itertools.count()). holding: a set, the requests the
        KV manager holds memory for (preemption takes the newest by order).
    batch_slots: the slots batch requests may hold, batch_size -
        reserved_interactive_slots.
    """

    def __init__(self, config: EngineConfig, kv):
        # Week 2 Day 6 Task 2: Planner: keep config and kv; batch_size empty slots,
        # nothing waiting, nothing ordered or holding, batch_slots, a counter for add
        self.config = config
        self.kv = kv
        self.slots: list[Request | None] = [None] * config.batch_size
        self.waiting: list[Request] = []
        self.order: dict[Request, int] = {}
        self.holding: set[Request] = set()
        self.batch_slots = config.batch_size - config.reserved_interactive_slots
        self.added = itertools.count()

    def add(self, request: Request) -> None:
        """An arrived request waits for its prefill (its arrival time is read now if
        nobody read it)."""
        # Week 2 Day 6 Task 2: add: append to waiting, give it the next number in order,
        # read metrics.arrival from metrics.clock() when it is None
        if request.metrics.arrival is None:
            request.metrics.arrival = request.metrics.clock()
        self.waiting.append(request)
        self.order[request] = next(self.added)

    def deadline(self, request: Request) -> float:
        """When the request should be served: an interactive request at its arrival,
        a batch one batch_patience seconds after its own. Earlier goes first."""
        patience = self.config.batch_patience if request.priority == "batch" else 0
        return request.metrics.arrival + patience

    def by_urgency(self) -> list[Request]:
        """The waiting requests, earliest deadline first, then the first added: an
        interactive request goes before the batch requests that arrived less than
        batch_patience seconds before it."""
        # Week 2 Day 6 Task 2: by_urgency: waiting sorted by (deadline, order)
        return sorted(self.waiting, key=lambda r: (self.deadline(r), self.order[r]))

    def decoding(self) -> list[tuple[int, Request]]:
        """(slot, request) of every occupied slot, lowest slot first."""
        # Week 2 Day 6 Task 2: decoding: (slot, request) of the occupied slots
        return [(slot, r) for slot, r in enumerate(self.slots) if r is not None]

    def slot_for(self, request: Request, also_ready: list[Request] = ()) -> int | None:
        """The lowest free slot this request may take, leaving one for each prefilled
        request and each in `also_ready` (their prefill ends this step); lowest first,
        so the batch cache's rows stay few. None for a batch request once batch
        requests, prefilled ones waiting for a slot included, hold batch_slots
        slots.

        As a rule: `ready` is the waiting requests other than `request` that are
        prefilled or in also_ready (each counted once); the free slots, lowest
        first, lose their first len(ready), and the answer is the first one left
        (None if none is). The batch requests counted are those in the slots and
        in `ready`."""
        # Week 2 Day 6 Task 2: slot_for: the free slots after leaving one per ready
        # request; None when there is none or a batch request would pass batch_slots
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
        policy = self.config.prefill_step
        if policy is None or isinstance(policy, int):
            return policy
        decoding = len(self.decoding())
        if is_adaptive(policy):
            size = policy.select_chunk_size(decoding, self.config.batch_size)
        else:
            size = policy(request.prefill_length, decoding, self.config.batch_size)
        check_int("the chunk size prefill_step chose", size, 1, allow_none=True)
        return size

    def admit(self, request: Request) -> bool:
        """Room for the request's prefill from the KV manager (True at once for a
        request already holding memory); it holds memory from then on, and moves
        past the prompt tokens the KV manager reports already cached (advance: the
        engine's one position write outside the model runner, because the chunks
        planned next start there)."""
        # Week 2 Day 6 Task 2: admit: True for a holder; else kv.admit (None: False),
        # and on success it joins holding and advances by the cached tokens
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
        still prefilling, not a later choice whose first choice (choice.first) is
        still prefilling (it waits to share that one's prompt), let start by
        `may_start` (week 3 day 1's partial-prefill limits; None: everyone), with a
        slot in view (slot_for, with also_ready as it is when each is asked) and
        memory held or given (admit). First come, first served: once one cannot get memory, nobody behind
        it who holds none overtakes it, while those holding memory go on."""
        # Week 2 Day 6 Task 2: prefill_candidates: by urgency, skip the prefilled, the
        # later choices whose first choice is neither prefilled nor finished, those
        # may_start refuses and those with no slot in view; admit the others until one
        # is refused, then only holders; yield each
        blocked = False
        for request in self.by_urgency():
            if request.is_prefill_done or (may_start and not may_start(request)):
                continue
            first = request.choice.first
            if first is not None and not (first.is_prefill_done or first.is_finished):
                continue
            if self.slot_for(request, also_ready) is None:
                continue
            if request not in self.holding and (blocked or not self.admit(request)):
                blocked = True
                continue
            yield request

    def decode_rows(self) -> list[Request | None]:
        """The slots up to the highest in use (an empty one among them: None)."""
        # Week 2 Day 6 Task 2: decode_rows: slots[: highest occupied slot + 1]
        active = self.decoding()
        return self.slots[: active[-1][0] + 1] if active else []

    def reserve(self, request: Request, tokens: int) -> int:
        """Room for the request's next `tokens` tokens from the KV manager (its
        reserve): how many fit, 0 when none does."""
        return self.kv.reserve(request, tokens)

    def place_prefilled(self) -> None:
        """Every prefilled waiting request, most urgent first, takes the slot
        slot_for gives it (the KV manager's place) and leaves waiting. One that
        slot_for gives None stays waiting, and the next is asked."""
        # Week 2 Day 6 Task 2: place_prefilled: each prefilled waiting request by
        # urgency takes slot_for(request) through kv.place
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
        # Week 2 Day 6 Task 2: leave: empty its slot (kv.remove) or take it out of
        # waiting; if it holds memory, kv.release it
        if request in self.slots:
            slot = self.slots.index(request)
            self.slots[slot] = None
            self.kv.remove(slot)
        elif request in self.waiting:
            self.waiting.remove(request)
        if request in self.holding:
            self.holding.remove(request)
            self.kv.release(request)

    def requeue(self, request: Request) -> None:
        """A request that left (leave) waits again, first in line; it keeps its
        place in `order` (preemption.py)."""
        # Week 3 Day 1 Task 4: requeue: back to the front of waiting
        self.waiting.insert(0, request)

    def retire_finished(self) -> None:
        """Every finished request (stopped, failed, aborted) leaves (leave) and is
        forgotten."""
        # Week 2 Day 6 Task 2: retire_finished: leave() and forget (order) every
        # finished request in the slots or waiting
        for request in self.slots + self.waiting:
            if request is not None and request.is_finished:
                self.leave(request)
                del self.order[request]
