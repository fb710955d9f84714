"""Preemption: whom to take memory back from when a forward has no room.

Memory is reserved for the tokens a forward computes, just before it (the KV
manager's reserve, through Planner.reserve). A dense cache always has room; a paged
pool can run dry (week 3 day 2), and under the mixed policy an interactive request
may take a batch request's slot (week 3 day 1). Then a request is preempted: it
gives its memory back and waits, first in line, to recompute its tokens
(Request.restart).

- No room for a decode: the newest request holding memory is preempted, the decoding
  request itself if it is that one (make_room_for_decodes).
- No room for a prefill chunk: only newer waiting requests are preempted, else the
  chunk waits (reserve_chunk). A prefill never preempts an older request or a decode.

Newest means batch before interactive, then the latest added (rank), so the oldest
interactive request always goes on and nothing deadlocks.
"""

from .planner import Planner
from .request import Request


class Preemption:
    """The preemption rules over a planner (planner.py: slots, waiting, holding,
    order). count: how many requests were preempted so far."""

    def __init__(self, planner: Planner):
        self.planner = planner
        self.count = 0

    # ANCHOR: make_room
    def make_room_for_decodes(self) -> None:
        """Before a decode forward: every decoding request gets room for its next
        token (Planner.reserve). While it cannot, the newest request holding memory
        is preempted (the request itself if it is that one)."""
        # Week 2 Day 6 Task 3: make_room_for_decodes: while planner.reserve(request, 1)
        # is 0 and the request still decodes, preempt(newest_holder())
        planner = self.planner
        for slot, request in planner.decoding():
            while planner.slots[slot] is request and not planner.reserve(request, 1):
                self.preempt(self.newest_holder())

    def rank(self, request: Request) -> tuple[bool, int]:
        """Higher is newer, preempted first: batch after interactive, then the
        order added."""
        # Week 3 Day 2 Task 4: rank: (priority == "batch", planner.order[request])
        return request.priority == "batch", self.planner.order[request]

    def newest_holder(self) -> Request:
        """The request to preempt: the newest batch request holding memory, else the
        newest interactive one."""
        # Week 3 Day 2 Task 4: newest_holder: max of planner.holding by rank
        return max(self.planner.holding, key=self.rank)

    def reserve_chunk(
        self, request: Request, size: int, planned: list[Request] = ()
    ) -> int:
        """Room for up to `size` tokens of the request's next chunk
        (Planner.reserve): the tokens to feed. With none, waiting requests that hold
        memory, are newer (rank) and not in `planned` (chunks already in this step's
        plan) are preempted, newest first, until there is room or none is left (0:
        the request waits)."""
        # Week 2 Day 6 Task 3: reserve_chunk: while planner.reserve(request, size) is 0,
        # preempt the newest waiting holder ranked above the request and not planned; 0
        # when there is none
        planner = self.planner
        while not (room := planner.reserve(request, size)):
            newer = [
                r
                for r in planner.holding
                if r in planner.waiting
                and r not in planned
                and self.rank(r) > self.rank(request)
            ]
            if not newer:
                return 0
            self.preempt(max(newer, key=self.rank))
        return room

    def preempt(self, request: Request) -> None:
        """Take a request's memory back (Planner.leave) and make it wait again,
        first in line (Planner.requeue), to recompute its tokens
        (Request.restart)."""
        # Week 3 Day 1 Task 4: preempt: planner.leave(request), request.restart(),
        # planner.requeue(request), count += 1
        self.planner.leave(request)
        request.restart()
        self.planner.requeue(request)
        self.count += 1

    # ANCHOR_END: make_room
