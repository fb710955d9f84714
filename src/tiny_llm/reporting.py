"""What the engine reports: every forward counted in the run's metrics, the
counts at the end of a step, one RequestOutput per request that moved, and a
snapshot of the slots for live views.

The engine (engine.py) decides and runs; this module only reads what happened and
writes it down. It holds the ids the engine gave its requests until each is
reported finished, so it is also where a request's tokens are counted as reported.
"""

from collections.abc import Callable
from dataclasses import dataclass, field

import mlx.core as mx

from tiny_llm_base import ForwardRecord, GenerationResult, SchedulerSnapshot, SlotView

from .metrics import RunMetrics
from .planner import Planner
from .policy import Policy
from .request import Request
from .runner import Forward


@dataclass
class RequestOutput:
    """What one request (one choice of it, when it asked n > 1) got in one step.

    tokens: the ids it accepted this step (an EOS is not one of them); text: the text
    they completed (the detokenizer's new segment). finish_reason is None while it
    runs; once set, `result` holds the request's GenerationResult and the engine
    forgets the request. index: the choice. logprobs: a TokenLogprob per token
    when its options asked, else []; prompt_logprobs: on its first output, when
    asked (else None).
    """

    request_id: int
    tokens: list[int]
    text: str
    finish_reason: str | None
    result: GenerationResult | None = None
    index: int = 0
    logprobs: list = field(default_factory=list)
    prompt_logprobs: list | None = None


class Reports:
    """The engine's reports. clock: the engine's clock. planner, policy, kv: read
    for the counts (never written).

    ids: request -> its id, from the engine reading its note until it is reported
    finished. reported: request -> tokens its outputs carried. added: requests
    tracked so far. started: the clock at the engine's first step (None before).
    metrics: the RunMetrics, with the KV manager's figures from the start."""

    def __init__(
        self, clock: Callable[[], float], planner: Planner, policy: Policy, kv
    ):
        raise NotImplementedError(
            "Week 2 Day 6: Reports: keep clock, planner, policy and kv; no ids, "
            "nothing reported or added, not started; a RunMetrics with "
            "kv_dense_tokens (batch_size x max_seq_len) and the KV manager's figures "
            "(kv.record)"
        )

    def start(self) -> None:
        """A step begins: the first one reads the clock (started)."""
        raise NotImplementedError(
            "Week 2 Day 6: start: started = clock() the first time"
        )

    def track(self, request: Request, request_id: int) -> None:
        """The engine read a request's note: remember its id, 0 tokens reported,
        count it in `added`."""
        raise NotImplementedError("Week 2 Day 6: track: ids, reported 0, added + 1")

    def record(self, forward: Forward) -> None:
        """Count a forward in the metrics: its chunks (and each request's
        prefill_chunks; a chunk that ended its prompt sampled a token), its decodes
        and the longest gap between two tokens of one request; and each of
        forward.drafts, (request, proposed, accepted), into metrics.record_drafts (a
        list that stays empty until week 3 day 4 writes the drafts and
        record_drafts)."""
        raise NotImplementedError(
            "Week 2 Day 6: record: the forward in the metrics (prefill chunk, decode "
            "step or mixed step), prefill_chunks, longest_decode_stall, "
            "metrics.record_drafts for each of forward.drafts"
        )

    def forward_record(self, forward: Forward) -> ForwardRecord:
        """The forward as the engine's on_forward sees it: request ids, not
        Requests."""
        raise NotImplementedError(
            "Week 2 Day 6: forward_record: a ForwardRecord of start, end, (id, "
            "tokens) per chunk, the decodes' ids and (id, fed, kept) per drafting "
            "request"
        )

    def count_requests(self) -> None:
        """At the end of a step: metrics.total_seconds (clock - started), running
        (occupied slots), waiting, finished (added minus the requests in `ids` not
        finished yet), peak_memory_bytes (mx.get_peak_memory()), the policy's
        preemptions, and the KV manager's own figures (kv.record)."""
        raise NotImplementedError(
            "Week 2 Day 6: count_requests: total_seconds, running, waiting, finished,"
            " peak memory, preemptions, kv.record"
        )

    def collect_outputs(self) -> list[RequestOutput]:
        """A RequestOutput for every request that accepted a token or finished this
        step: its new tokens (generated past `reported`), the detokenizer's
        last_segment as text ("" without a detokenizer), its finish_reason and
        index, the sampling state's logprobs of the new tokens (the same slice of
        its list) and, on the request's first output, its prompt_logprobs. A
        finished request's output carries result() and is forgotten here."""
        raise NotImplementedError(
            "Week 2 Day 6: collect_outputs: a RequestOutput per request with new "
            "tokens or finished (index, logprobs, prompt_logprobs on the first); "
            "forget the finished"
        )

    def snapshot(
        self, steps_done: int, prefilling: Request | None
    ) -> SchedulerSnapshot:
        """The slots, the request prefilling and the counters, for live views: a
        SlotView(id, priority, offset, len(generated), text[-40:]) per occupied slot
        and None per free one; (id, offset, prompt tokens) of `prefilling`."""
        raise NotImplementedError(
            "Week 2 Day 6: snapshot: SlotViews, prefilling, counters"
        )
