"""The mixed policy (week 3 day 1): what ONE forward of decodes and prefill chunks runs.

plan_mixed asks the planner (planner.py: slots, the waiting queue, room from the KV
manager) for every decoding request's next token first, so decodes never wait, then
for prefill chunks, most urgent first, within `token_budget`. The model runner
(runner.py) runs the plan as one forward (mixed_step.py).

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
memory pressure, week 2 day 6). Only batch requests whose deadline
(Planner.deadline: arrival + batch_patience) is later than the interactive request's
can be preempted, so a batch request older than batch_patience is never preempted or
overtaken again: it is never starved.
"""

import itertools
import math

from tiny_llm_base.config_checks import is_adaptive

from .planner import Plan, Planner
from .request import Request
from .speculative import plan_drafts


# ANCHOR: is_long
def is_long(planner: Planner, request: Request) -> bool:
    """True for a prompt of more than long_prefill_token_threshold tokens (never when
    the threshold is None)."""
    raise NotImplementedError(
        "Week 3 Day 1: is_long: the threshold is set and the prompt's tokens pass it"
    )
    # ANCHOR_END: is_long


# ANCHOR: may_start
def may_start(planner: Planner, request: Request, started: list[Request]) -> bool:
    """The partial-prefill limits. `started`: the requests that have started
    prefilling (offset > 0, or planned this step). A started request goes on; one
    that has not may start only while fewer than max_num_partial_prefills of the
    waiting requests are partly prefilled (started, not done), and, if it is long,
    fewer than max_long_partial_prefills of those are long (None: no limit)."""
    raise NotImplementedError(
        "Week 3 Day 1: may_start: True for a started request; else the partly "
        "prefilled waiting requests (in started, not prefill-done) and the long ones "
        "among them, each under its limit"
    )
    # ANCHOR_END: may_start


# ANCHOR: chunk_limit
def chunk_limit(planner: Planner, request: Request, size: int | None) -> int:
    """The request's next chunk: the prompt tokens it has left, at most `size` (the
    chunk size policy's answer; None: no cap) and, for a long prompt, at most
    long_prefill_token_threshold and at most the most tokens L whose attention
    scores, L x (offset + L) (each of the chunk's tokens against every position up
    to the chunk's end), stay within long_prefill_attention_budget (None: no such
    cap), but always at least 1 token."""
    raise NotImplementedError(
        "Week 3 Day 1: chunk_limit: min of the tokens left, size (unless None) and, "
        "when is_long, the threshold and (unless None) the largest L >= 1 with L * "
        "(request.offset + L) <= long_prefill_attention_budget"
    )
    # ANCHOR_END: chunk_limit


# ANCHOR: preempt_for_interactive
def preempt_for_interactive(planner: Planner, started: list[Request]) -> None:
    """Before a mixed step is planned: each waiting interactive request, most urgent
    first, that is still prefilling and may start (may_start) but has no slot in view
    (planner.slot_for with the requests in `started` but the long ones: a long one
    yields its slot to an interactive request) preempts decoding batch requests
    whose deadline is later than its own, latest first, until it has one or none is
    left."""
    raise NotImplementedError(
        "Week 3 Day 1: preempt_for_interactive: for each waiting interactive request "
        "by urgency, not prefill-done, may_start: while slot_for (with the started "
        "requests that are not is_long) is None, planner.preempt the decoding batch "
        "request with the latest deadline past its own (stop when none)"
    )
    # ANCHOR_END: preempt_for_interactive


def plan_mixed(planner: Planner) -> Plan:
    """The mixed policy's plan for ONE forward, made with the planner's rules: an
    interactive request with no slot preempts batch work first
    (preempt_for_interactive); then every decode row (room made for them); with
    config.speculative or config.jump_forward, the decoding requests' draft tokens
    (plan_drafts, week 3 days 4 and 5); then prefill chunks, most urgent first, until
    token_budget is spent (None: no limit). Every row fed counts against the budget,
    an empty slot's dummy row and every draft token too.

    The requests come from planner.prefill_candidates (a slot in view, room from the
    KV manager, first come first served) with may_start's partial-prefill limits,
    asked with the requests that have started prefilling (offset > 0) and those
    planned so far, each of which keeps a slot in view, except a long one (is_long)
    that has started: it yields (an interactive one to interactive requests, a batch
    one to everyone). It is asked after everyone else, keeps its slot in view only
    from those it does not yield to, and gets no chunk in a step that has a chunk of
    one it yields to; so it pauses while every slot is taken and a request it yields
    to waits, and a request it yields to runs its chunk without it.
    Each chunk is chunk_limit(planner, request, chunk size) (a long prompt's caps
    included), at most the budget left, cut to the room planner.reserve_chunk makes
    for it; a chunk with no room ends the plan (first come, first served). An
    AdaptiveChunker is asked once a step (it learns from one time a step); a size a
    policy gets wrong fails that request alone, and the next request asks the
    policy again.
    """
    raise NotImplementedError(
        "Week 3 Day 1: plan_mixed: preempt_for_interactive, room for the decodes, "
        "their rows, the drafts (plan_drafts, only with config.speculative or "
        "jump_forward), then chunks from prefill_candidates with may_start within the"
        " budget left; the started long requests yield (asked last, an interactive "
        "one's slot kept in view from batch requests only, a batch one's from nobody;"
        " no chunk in a step with a chunk of a request it yields to), the other "
        "started and the planned ones keep a slot in view; each chunk_limit, cut to "
        "what planner.reserve_chunk makes room for (stop at the first that gets "
        "none); Plan(rows, chunks, mixed=True, drafts)"
    )
