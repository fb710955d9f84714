"""The engine: requests come and go while it runs, and each `step()` moves every one
of them forward.

Other threads may call `add_request` and `abort` at any time: both only leave a note
in an inbox, which the engine's own thread reads at the start of its next step, so
the model and the caches are only ever touched by that thread.

A step is: read the inbox, admit the arrivals, let the planner decide what runs
(planner.py), let the model runner run it (runner.py), then report what each request
got. Where keys and values live is the KV manager's business (kv_manager.py: dense;
paged_manager.py and prefix_cache.py: week 3 days 2 and 3).
"""

import itertools
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import mlx.core as mx

from tiny_llm_base import (
    EngineConfig,
    ForwardRecord,
    GenerationResult,
    PromptSpec,
    SchedulerSnapshot,
    SlotView,
    check_int,
)
from tiny_llm_base.config import check_callable
from tiny_llm_base.config_checks import is_adaptive

from .choices import choices_to_stop, make_choices
from .disk_tier import DiskTierKvManager
from .kv_manager import DenseKvManager
from .metrics import RunMetrics
from .mixed_policy import plan_mixed
from .paged_manager import PagedKvManager
from .planner import Plan, Planner
from .prefix_cache import PrefixCachingKvManager
from .request import Request
from .runner import Forward, ModelRunner
from .step_ahead import StepAheadRunner


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


def make_kv_manager(model, config: EngineConfig):
    """The KV manager the config asks for: dense, paged, or paged with prefix
    caching (with kv_disk_dir, the given DiskTierKvManager: prefix caching with a
    disk tier)."""
    raise NotImplementedError(
        "Week 2 Day 6: make_kv_manager: DenseKvManager, PagedKvManager or "
        "PrefixCachingKvManager as config.kv_cache and prefix_caching say, a "
        "DiskTierKvManager when config.kv_disk_dir is set"
    )


class Engine:
    """Continuous batching with chunked prefill, online.

    config: an EngineConfig; keyword `settings` replace its fields (Engine(model,
    tokenizer, batch_size=4, policy="mixed")). clock: every time in the metrics is a
    reading of it. on_forward: called with a ForwardRecord after every forward (for
    timelines).

    The state: model, tokenizer, config, clock, on_forward as given; kv
    (make_kv_manager); planner, the Planner; runner, your ModelRunner, or with
    config.step_ahead the given StepAheadRunner (step_ahead.py: decode forwards
    started a step ahead, same tokens); inbox, a queue.SimpleQueue of notes from
    add_request and abort; next_id: ids 0, 1, 2, ...; ids: request -> id until it is
    reported finished; reported: request -> tokens its outputs carried; arriving:
    (arrival_step, request) read, not admitted; added: requests read; steps_done;
    started: the clock at the first step (None before); prefilled: the request whose
    chunk ran last step, prefill not done (snapshot); metrics: the RunMetrics, with
    the KV manager's figures from the start (the peak memory is reset)."""

    def __init__(
        self,
        model,
        tokenizer,
        config: EngineConfig | None = None,
        clock: Callable[[], float] = time.perf_counter,
        on_forward: Callable[[ForwardRecord], None] | None = None,
        **settings,
    ):
        raise NotImplementedError(
            "Week 2 Day 6: Engine: EngineConfig.of(config, settings), check_model, "
            "check the clock, then the state listed above"
        )

    def add_request(self, prompt: str | list[int] | PromptSpec) -> int:
        """Queue a prompt (any thread); returns its request id.

        A plain prompt is PromptSpec(prompt). Its Requests are made here, one per
        choice (make_choices, choices.py: n > 1 makes n under the one id): a bad
        prompt has already failed ("error") and finishes in the engine's next step,
        costing nobody else anything. Only notes go into the inbox, one per Request,
        ("add", id, request, arrival_step): the engine's thread reads them.
        ValueError or TypeError for a bad arrival_step or n.
        """
        raise NotImplementedError(
            'Week 2 Day 6: add_request: check arrival_step; make_choices; put ("add",'
            " id, request, arrival_step) in the inbox for each, return the id"
        )

    def abort(self, request_id: int, index: int | None = None) -> None:
        """Stop a request (any thread): within the next step it finishes with
        "abort" and frees its slot and memory, whether it waits, prefills or
        decodes; every choice of it, or only choice `index`. An unknown or finished
        id is ignored."""
        raise NotImplementedError(
            'Week 2 Day 6: abort: put ("abort", id, index, None) in the inbox'
        )

    def close(self) -> None:
        """Ends queued MLX work (a forward started ahead) and closes the KV manager
        (kv_disk_dir: named blocks go to disk); call it on the thread that steps."""
        mx.synchronize()  # a process that exits with MLX work in flight aborts
        self.kv.close()

    def nothing_waits(self) -> bool:
        """True when the next plan can only decode this one's rows: no note, arrival
        or waiting request (a row an EOS frees goes to it at once), no drafts (they
        need the token read)."""
        busy = self.arriving or self.planner.waiting or not self.inbox.empty()
        return not (busy or self.config.speculative)

    def has_unfinished(self) -> bool:
        """True while a request has not been reported finished, or a note waits in
        the inbox (a request just added counts before the engine has read it)."""
        raise NotImplementedError(
            "Week 2 Day 6: has_unfinished: ids not empty, or the inbox not empty"
        )

    # ANCHOR: step
    def step(self) -> list[RequestOutput]:
        """One iteration: read the inbox, admit arrivals, plan and run the policy's
        forward(s), and report what each request got."""
        raise NotImplementedError(
            "Week 2 Day 6: step: started, read_inbox, admit_arrivals, run the policy "
            "(alternate: plan_chunk, place_prefilled, plan_decodes; mixed: "
            "plan_mixed, place_prefilled), kv.after_step (in a finally), steps_done, "
            "count_requests, collect_outputs"
        )

    def run(self, plan: Plan) -> None:
        """Run a plan (nothing if it is empty), then retire the requests it finished
        or failed and record the forward; an interrupt still retires them first."""
        raise NotImplementedError(
            "Week 2 Day 6: run: runner.run(plan), planner.retire_finished() even on "
            "an interrupt, prefilled, record"
        )

    # ANCHOR_END: step

    def read_inbox(self) -> None:
        """Take every note out of the inbox. ("add", id, request, arrival_step):
        remember the id, 0 tokens reported, put it in `arriving`, count it in
        `added`. ("abort", id, index, None): stop(id, index)."""
        raise NotImplementedError(
            'Week 2 Day 6: read_inbox: drain the inbox; "add" notes into ids, '
            'reported, arriving, added; "abort" notes to stop'
        )

    def stop(self, request_id: int, index: int | None = None) -> None:
        """Abort a request now (the engine's thread): each of its choices (only
        choice `index` unless None) that is not finished finishes with "abort" and
        leaves wherever it is. An id that is unknown or already reported is
        ignored."""
        raise NotImplementedError(
            'Week 2 Day 6: stop: each of choices_to_stop finishes with "abort" and '
            "leaves arriving; retire them"
        )

    def admit_arrivals(self) -> None:
        """Admit the requests whose arrival_step the steps done so far have reached;
        their arrival time is read now. A request that has already failed (a bad
        prompt) gets its arrival time but does not wait."""
        raise NotImplementedError(
            "Week 2 Day 6: admit_arrivals: requests whose arrival_step is reached get"
            " their arrival time and join the planner"
        )

    def record(self, forward: Forward) -> None:
        """Count a forward in the metrics: its chunks (and each request's
        prefill_chunks; a chunk that ended its prompt sampled a token), its decodes
        and the longest gap between two tokens of one request; tell an
        AdaptiveChunker the time of a forward that ran a chunk; call on_forward with
        a ForwardRecord of request ids; and each of forward.drafts, (request,
        proposed, accepted), into metrics.record_drafts (a list that stays empty
        until week 3 day 4 writes the drafts and record_drafts)."""
        raise NotImplementedError(
            "Week 2 Day 6: record: the forward in the metrics (prefill chunk, decode "
            "step or mixed step), prefill_chunks, longest_decode_stall, the "
            "AdaptiveChunker, on_forward, metrics.record_drafts for each of "
            "forward.drafts"
        )

    def count_requests(self) -> None:
        """At the end of a step: metrics.total_seconds (clock - started), running
        (occupied slots), waiting, finished (added minus the requests in `ids` not
        finished yet), peak_memory_bytes (mx.get_peak_memory()), the planner's
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
        finished request's output carries result() and the engine forgets it."""
        raise NotImplementedError(
            "Week 2 Day 6: collect_outputs: a RequestOutput per request with new "
            "tokens or finished (index, logprobs, prompt_logprobs on the first); "
            "forget the finished"
        )

    def snapshot(self) -> SchedulerSnapshot:
        """The slots, the request prefilling and the counters, for live views: a
        SlotView(id, priority, offset, len(generated), text[-40:]) per occupied slot
        and None per free one; (id, offset, prompt tokens) of `prefilled`."""
        raise NotImplementedError(
            "Week 2 Day 6: snapshot: SlotViews, prefilling, counters"
        )
