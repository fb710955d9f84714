"""The mixed policy (week 3 day 1): what ONE forward of decodes and prefill chunks runs.

MixedPolicy.plan asks the planner (planner.py: slots, the waiting queue, room from
the KV manager) for every decoding request's next token first, so decodes never
wait, then for prefill chunks, most urgent first, within `token_budget`. The model
runner (runner.py) runs the plan as one forward (mixed_step.py).

Left alone, one long prompt sets the pace of every step it is in: each of its
chunks is a full prefill_step at an ever longer context, and a short chat that
arrives behind it waits for those steps. Four limits decide who waits (the first
three are vLLM's names):

- long_prefill_token_threshold: a prompt of more tokens than this is long, and a long
  prompt's chunk is at most this many tokens, so the steps it shares stay short;
- long_prefill_attention_budget: a long prompt's chunk of L tokens at offset o also
  keeps its attention scores, L x (o + L), within this budget, so the chunk shrinks
  as it goes deeper and every step it is in stays short where attention dominates
  (a chat that arrives waits for the step in flight, whoever is in it);
- max_num_partial_prefills: at most this many requests partly prefilled at once; a
  request that has not started waits (1: one prompt at a time, in arrival order);
- max_long_partial_prefills: at most this many of them long, so a few long prompts
  never hold every prefill place while short ones queue.

A long prompt that has started also yields its slot and its step: it is asked for a
chunk after everyone else and keeps no slot in view for itself (an interactive one
keeps it from batch requests only), so it gets a chunk only while a slot is in view
after the others took theirs, and only in a step that runs no chunk of a request it
yields to: a chat's first token comes from a step without the long prompt's chunk.
When every slot is taken and a chat waits, the long one pauses (it keeps its cache
and its place among the partial prefills): the steps are plain decodes, short, the
decoding chats finish sooner and hand their slots on. So while a long prompt
pauses, more requests are partly prefilled than there will be slots; it waits for a
slot when its prefill ends.

And priorities act: when every slot is taken, a waiting interactive request preempts
a decoding batch request (it gives its memory back and recomputes later, as under
memory pressure, preemption.py). Only batch requests whose deadline
(Planner.deadline: arrival + batch_patience) is later than the interactive request's
can be preempted, so a batch request older than batch_patience is never preempted or
overtaken again: it is never starved.
"""

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass, field

from tiny_llm_base.config_checks import is_adaptive

from .planner import Plan
from .policy import Policy
from .request import Request
from .speculative import plan_drafts


@dataclass
class Sharing:
    """Who shares one mixed step's prefill chunks, as MixedPolicy.plan_chunks goes.

    started: the waiting requests that have started prefilling (offset > 0), and
        those planned so far (may_start's list). yielding: the long ones
        (MixedPolicy.is_long) that had started when the step began: they yield.
    in_view: the requests that keep a slot in view from everyone (slot_for's
        also_ready): the started ones that do not yield, and those planned.
    kept_from_batch: in_view and the yielding interactive ones: an interactive long
        prompt yields its slot to interactive requests only.
    chunks: (request, tokens) planned so far.
    """

    started: list[Request]
    yielding: list[Request]
    in_view: list[Request] = field(init=False)
    kept_from_batch: list[Request] = field(init=False)
    chunks: list[tuple[Request, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        raise NotImplementedError(
            "Week 3 Day 1 Task 3: Sharing: in_view, the started requests not "
            "yielding; kept_from_batch, in_view and the interactive yielding ones"
        )

    def yields_to(self, request: Request, other: Request) -> bool:
        """A yielding `request` yields to `other` when other does not yield and
        either request is batch or other is interactive."""
        raise NotImplementedError(
            "Week 3 Day 1 Task 3: yields_to: other not yielding, and request batch or"
            " other interactive"
        )

    def add(self, request: Request, tokens: int) -> None:
        """A chunk of `tokens` is planned for the request: it has started and keeps
        a slot in view from now on."""
        raise NotImplementedError(
            "Week 3 Day 1 Task 3: add: append to chunks; join started, in_view and "
            "kept_from_batch where it is not yet"
        )


class MixedPolicy(Policy):
    """Week 3 day 1: one forward a step for every decode and the chunks (see the
    module)."""

    def plans(self) -> Iterator[Plan]:
        """ONE plan (plan()); then the requests it prefilled take their slots
        (place_prefilled)."""
        raise NotImplementedError(
            "Week 3 Day 1 Task 3: plans: yield plan(), then place_prefilled"
        )

    # ANCHOR: is_long
    def is_long(self, request: Request) -> bool:
        """True for a prompt of more than long_prefill_token_threshold tokens (never
        when the threshold is None). The count is prefill_length, what its prefill
        computes: after a restart, the prompt and the tokens generated so far."""
        raise NotImplementedError(
            "Week 3 Day 1 Task 2: is_long: the threshold is set and prefill_length "
            "passes it"
        )
        # ANCHOR_END: is_long

    # ANCHOR: may_start
    def may_start(self, request: Request, started: list[Request]) -> bool:
        """The partial-prefill limits. `started`: the requests that have started
        prefilling (offset > 0, or planned this step). A started request goes on (in
        `started`, or offset > 0 though not in it); one that has not may start only
        while fewer than max_num_partial_prefills of the waiting requests are partly
        prefilled (in `started`, not prefill-done), and, if it is long, fewer than
        max_long_partial_prefills of those are long (None: no limit)."""
        raise NotImplementedError(
            "Week 3 Day 1 Task 2: may_start: True for a request in started or with "
            "offset > 0; else the partly prefilled waiting requests (in started, not "
            "prefill-done) and the long ones among them, each under its limit"
        )
        # ANCHOR_END: may_start

    # ANCHOR: chunk_limit
    def chunk_limit(self, request: Request, size: int | None) -> int:
        """The request's next chunk: the prompt tokens it has left, at most `size`
        (the chunk size policy's answer; None: no cap) and, for a long prompt, at
        most long_prefill_token_threshold and at most the most tokens L whose
        attention scores, L x (offset + L) (each of the chunk's tokens against every
        position up to the chunk's end), stay within long_prefill_attention_budget
        (None: no such cap), but always at least 1 token."""
        raise NotImplementedError(
            "Week 3 Day 1 Task 2: chunk_limit: min of the tokens left, size (unless "
            "None) and, when is_long, the threshold and (unless None) the largest L "
            ">= 1 with L * (request.offset + L) <= long_prefill_attention_budget"
        )
        # ANCHOR_END: chunk_limit

    # ANCHOR: preempt_for_interactive
    def preempt_for_interactive(self, started: list[Request]) -> None:
        """Before a mixed step is planned: each waiting interactive request, most
        urgent first, that is still prefilling and may start (may_start) but has no
        slot in view (planner.slot_for with the requests in `started` but the long
        ones: a long one yields its slot to an interactive request) preempts
        decoding batch requests whose deadline is later than its own, latest first (a
        tie: the lowest slot), through preemption.preempt, until it has one or none
        is left."""
        raise NotImplementedError(
            "Week 3 Day 1 Task 3: preempt_for_interactive: for each waiting "
            "interactive request by urgency, not prefill-done, may_start: while "
            "slot_for (with the started requests that are not is_long) is None, "
            "preempt the decoding batch request with the latest deadline past its own"
            " (stop when none)"
        )
        # ANCHOR_END: preempt_for_interactive

    def plan(self) -> Plan:
        """The plan for ONE forward, made with the planner's rules: an interactive
        request with no slot preempts batch work first (preempt_for_interactive);
        then every decode row (room made for them, preemption.make_room_for_decodes);
        with config.speculative or config.jump_forward, the decoding requests'
        draft tokens (plan_drafts, week 3 days 4 and 5); then prefill chunks
        (plan_chunks) until token_budget is spent (None: no limit). Every row fed
        counts against the budget, an empty slot's dummy row and every draft token
        too. Finished requests (a chunk size that failed) are retired."""
        raise NotImplementedError(
            "Week 3 Day 1 Task 3: plan: the started requests (offset > 0); "
            "preempt_for_interactive; make_room_for_decodes; the rows; the budget "
            "left after them and the drafts (plan_drafts, only with "
            "config.speculative or jump_forward); plan_chunks; retire_finished; "
            "Plan(rows, chunks, mixed=True, drafts)"
        )

    def plan_chunks(self, started: list[Request], budget: float) -> list:
        """Prefill chunks within `budget` tokens, most urgent first: (request,
        tokens) each.

        The requests come from planner.prefill_candidates (a slot in view, room from
        the KV manager, first come first served), asked with a Sharing of
        `started`: each started request keeps a slot in view, except a long one
        (is_long) that has started: it yields (an interactive one to interactive
        requests, a batch one to everyone). The requests that do not yield are asked
        first (in_first_round); the yielding ones after them (in_last_round), and a
        yielding one gets no chunk in a step that has a chunk of one it yields to;
        so it pauses while every slot is taken and a request it yields to waits.
        Each chunk is chunk_limit(request, chunk size), at most the budget left, cut
        to the room preemption.reserve_chunk makes for it; a chunk with no room ends
        the plan (first come, first served). An AdaptiveChunker is asked once a step
        (it learns from one time a step); a size a policy gets wrong fails that
        request alone (request.fail(f"prefill failed: {type(error).__name__}:
        {error}"), as the alternate policy's plan_chunk), and the next request asks
        again."""
        raise NotImplementedError(
            "Week 3 Day 1 Task 3: plan_chunks: a Sharing (yielding: the started "
            "is_long ones); prefill_candidates(in_view, in_first_round), then "
            "(in_view, in_last_round); for each while budget is left: the chunk size "
            "(once a step for an AdaptiveChunker), chunk_limit, the budget, "
            "reserve_chunk with the planned requests (stop at 0); Sharing.add; the "
            "chunks"
        )

    def in_first_round(self, request: Request, sharing: Sharing) -> bool:
        """Asked first: a request that does not yield and may start; a batch one
        only with a slot in view past every kept_from_batch request."""
        raise NotImplementedError(
            "Week 3 Day 1 Task 3: in_first_round: not yielding, may_start, and for a "
            "batch request slot_for(request, kept_from_batch) is not None"
        )

    def in_last_round(self, request: Request, sharing: Sharing) -> bool:
        """Asked last: a yielding request that may start, in a step with no chunk
        of one it yields to."""
        raise NotImplementedError(
            "Week 3 Day 1 Task 3: in_last_round: yielding, may_start, and yields_to "
            "none of the chunks' requests"
        )
