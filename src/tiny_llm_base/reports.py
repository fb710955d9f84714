"""What a batch_generate run reports: a snapshot per iteration for live views, and
the results list that carries the run's metrics."""

from dataclasses import dataclass, field


@dataclass
class SlotView:
    """One occupied decode slot at the end of a scheduler iteration.

    request: the request's id: its index in batch_generate's prompt list (the id
        Engine.add_request returned).
    priority: its priority, "batch" or "interactive".
    offset: tokens in its KV cache: the prompt, plus every token fed back in a
        decode step (the token sampled last is not in the cache yet).
    generated: tokens generated so far, the one its last prefill chunk sampled
        included; an EOS never counts, since the request leaves its slot at once.
    text_tail: the last 40 characters of its text so far.
    """

    request: int
    priority: str
    offset: int
    generated: int
    text_tail: str


@dataclass
class SchedulerSnapshot:
    """The state at the end of a scheduler iteration, after its forwards: what
    batch_generate's `on_step` receives, and Engine.snapshot() returns.

    step: iterations done, this one included: 1 in the first snapshot. A request with
        arrival_step s is admitted in the iteration whose snapshot says s + 1.
    slots: batch_size entries: slot i's SlotView, or None where slot i is free. A
        request that finished in this iteration has already left its slot.
    prefilling: (request index, offset, prompt tokens) of the request whose prefill
        chunk ran in this iteration, if its prefill is not done: offset counts the
        prompt tokens prefilled so far, this chunk's included. None when no chunk ran
        or the chunk was the request's last (it then holds a slot, waits for one, or
        has finished).
    finished: requests finished so far, whatever the reason (RunMetrics.finished).
    total: requests in the run so far: len(prompts) in batch_generate.
    metrics: the run's RunMetrics: the same object in every snapshot, updated in
        place, so copy a value to keep it.
    """

    step: int
    slots: list[SlotView | None]
    prefilling: tuple[int, int, int] | None
    finished: int
    total: int
    metrics: object


@dataclass
class ForwardRecord:
    """One model forward of the engine, for timelines: when it ran and what was in it.

    start, end: readings of the engine's clock around the forward. chunks: (request
    id, prompt tokens) of each prefill chunk in it; decodes: the ids of the requests
    that got a decode token from it. The alternate policy runs two forwards a step
    (a chunk, then the decodes), the mixed policy one. drafts: (request id, draft
    tokens fed, draft tokens accepted) of each decode row that carried drafts (week
    3 day 4).
    """

    start: float
    end: float
    chunks: list[tuple[int, int]]
    decodes: list[int]
    drafts: list[tuple[int, int, int]] = field(default_factory=list)


class BatchResults(list):
    """A list of GenerationResult, one per prompt in prompt order, plus `.metrics`:
    the run's RunMetrics, final (the object the snapshots carried)."""

    metrics: object
