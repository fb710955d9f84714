"""What a batch_generate run reports: a snapshot per iteration for live views, and
the results list that carries the run's metrics."""

from dataclasses import dataclass


@dataclass
class SlotView:
    """What one decode slot holds, for live views.

    request: the request's index in the prompt list; offset: tokens in its cache;
    generated: tokens generated so far; text_tail: the last 40 characters of its text.
    """

    request: int
    priority: str
    offset: int
    generated: int
    text_tail: str


@dataclass
class SchedulerSnapshot:
    """Reported to `on_step` after every iteration.

    step: iterations done so far (1 after the first). slots: one SlotView or None per
    decode slot. prefilling: (request index, offset, prompt tokens) of the request
    whose chunk ran this iteration and still has prompt left, else None. finished,
    total: requests finished and requests in the run. metrics: the run's RunMetrics.
    """

    step: int
    slots: list[SlotView | None]
    prefilling: tuple[int, int, int] | None
    finished: int
    total: int
    metrics: object


class BatchResults(list):
    """One GenerationResult per prompt, in prompt order, plus `.metrics`, the run's
    RunMetrics."""

    metrics: object
