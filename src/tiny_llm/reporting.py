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
        self.clock = clock
        self.planner = planner
        self.policy = policy
        self.kv = kv
        self.ids: dict[Request, int] = {}
        self.reported: dict[Request, int] = {}
        self.added = 0
        self.started: float | None = None
        self.metrics = RunMetrics()
        config = planner.config
        self.metrics.kv_dense_tokens = config.batch_size * config.max_seq_len
        kv.record(self.metrics)

    def start(self) -> None:
        """A step begins: the first one reads the clock (started)."""
        if self.started is None:
            self.started = self.clock()

    def track(self, request: Request, request_id: int) -> None:
        """The engine read a request's note: remember its id, 0 tokens reported,
        count it in `added`."""
        self.ids[request] = request_id
        self.reported[request] = 0
        self.added += 1

    def record(self, forward: Forward) -> None:
        """Count a forward in the metrics: its chunks (and each request's
        prefill_chunks; a chunk that ended its prompt sampled a token), its decodes
        and the longest gap between two tokens of one request; and each of
        forward.drafts, (request, proposed, accepted), into metrics.record_drafts (a
        list that stays empty until week 3 day 4 writes the drafts and
        record_drafts)."""
        metrics, chunks = self.metrics, forward.chunks
        for request, _ in chunks:
            request.metrics.prefill_chunks += 1
            if request.is_prefill_done:  # its last chunk sampled a token
                metrics.generated_tokens += 1
        if forward.mixed:
            metrics.record_mixed_step(
                [n for _, n in chunks], len(forward.decodes), forward.seconds
            )
        elif chunks:
            metrics.record_prefill_chunk(chunks[0][1], forward.seconds)
        else:
            metrics.record_decode_step(len(forward.decodes), forward.seconds)
        for _, proposed, accepted in forward.drafts:
            metrics.record_drafts(proposed, accepted)
        for request in forward.decodes:
            times = request.metrics.token_times
            if len(times) >= 2:
                stall = times[-1] - times[-2]
                metrics.longest_decode_stall = max(metrics.longest_decode_stall, stall)

    def forward_record(self, forward: Forward) -> ForwardRecord:
        """The forward as the engine's on_forward sees it: request ids, not
        Requests."""
        ids = self.ids
        return ForwardRecord(
            forward.start,
            forward.start + forward.seconds,
            [(ids[r], n) for r, n in forward.chunks],
            [ids[r] for r in forward.decodes],
            [(ids[r], fed, kept) for r, fed, kept in forward.drafts],
        )

    def count_requests(self) -> None:
        """At the end of a step: metrics.total_seconds (clock - started), running
        (occupied slots), waiting, finished (added minus the requests in `ids` not
        finished yet), peak_memory_bytes (mx.get_peak_memory()), the policy's
        preemptions, and the KV manager's own figures (kv.record)."""
        metrics = self.metrics
        metrics.total_seconds = self.clock() - self.started
        metrics.running = len(self.planner.decoding())
        metrics.waiting = len(self.planner.waiting)
        metrics.finished = self.added - sum(not r.is_finished for r in self.ids)
        metrics.peak_memory_bytes = mx.get_peak_memory()
        metrics.preemptions = self.policy.preemptions
        self.kv.record(metrics)

    def collect_outputs(self) -> list[RequestOutput]:
        """A RequestOutput for every request that accepted a token or finished this
        step: its new tokens (generated past `reported`), the detokenizer's
        last_segment as text ("" without a detokenizer), its finish_reason and
        index, the sampling state's logprobs of the new tokens (the same slice of
        its list) and, on the request's first output, its prompt_logprobs. A
        finished request's output carries result() and is forgotten here."""
        outputs = []
        for request, request_id in list(self.ids.items()):
            done = self.reported[request]
            new = request.generated[done:]
            if not new and not request.is_finished:
                continue
            self.reported[request] += len(new)
            text = request.detokenizer.last_segment if request.detokenizer else ""
            state = request.sampling_state
            output = RequestOutput(
                request_id,
                new,
                text,
                request.finish_reason,
                index=request.choice.index,
                logprobs=list(state.logprobs[done : done + len(new)]),
                prompt_logprobs=None if done else state.prompt_logprobs,
            )
            if request.is_finished:
                output.result = request.result()
                del self.ids[request], self.reported[request]
            outputs.append(output)
        return outputs

    def snapshot(
        self, steps_done: int, prefilling: Request | None
    ) -> SchedulerSnapshot:
        """The slots, the request prefilling and the counters, for live views: a
        SlotView(id, priority, offset, len(generated), text[-40:]) per occupied slot
        and None per free one; (id, offset, prompt tokens) of `prefilling`."""
        views = [
            None
            if r is None
            else SlotView(
                self.ids[r], r.priority, r.offset, len(r.generated), r.text[-40:]
            )
            for r in self.planner.slots
        ]
        chunking = None
        if prefilling is not None:
            chunking = (
                self.ids[prefilling],
                prefilling.offset,
                prefilling.prefill_length,
            )
        return SchedulerSnapshot(
            steps_done, views, chunking, self.metrics.finished, self.added, self.metrics
        )
