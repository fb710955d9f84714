"""The engine: requests come and go while it runs, and each `step()` moves every one
of them forward.

Other threads may call `add_request` and `abort` at any time: both only leave a note
in an inbox, which the engine's own thread reads at the start of its next step, so
the model and the caches are only ever touched by that thread.

A step is: read the inbox, admit the arrivals, let the policy plan what runs with
the planner's mechanism (policy.py, mixed_policy.py; planner.py), let the model
runner run each plan (runner.py), then report what each request got (reporting.py).
Where keys and values live is the KV manager's business (kv_manager.py: dense;
paged_manager.py and prefix_cache.py: week 3 days 2 and 3).
"""

import itertools
import queue
import time
from collections.abc import Callable

import mlx.core as mx

from tiny_llm_base import (
    EngineConfig,
    ForwardRecord,
    PromptSpec,
    SchedulerSnapshot,
    check_int,
)
from tiny_llm_base.config import check_callable
from tiny_llm_base.config_checks import is_adaptive

from .choices import choices_to_stop, make_choices
from .disk_tier import DiskTierKvManager
from .kv_manager import DenseKvManager
from .metrics import RunMetrics
from .mixed_policy import MixedPolicy
from .paged_manager import PagedKvManager
from .planner import Plan, Planner
from .policy import AlternatePolicy, Policy
from .prefix_cache import PrefixCachingKvManager
from .reporting import Reports, RequestOutput
from .request import Request
from .runner import ModelRunner
from .step_ahead import StepAheadRunner


def make_kv_manager(model, config: EngineConfig):
    """The KV manager the config asks for: dense, paged, or paged with prefix
    caching (with kv_disk_dir, the given DiskTierKvManager: prefix caching with a
    disk tier)."""
    if config.kv_cache == "dense":
        return DenseKvManager(model, config)
    if config.kv_disk_dir is not None:
        return DiskTierKvManager(model, config)
    if config.prefix_caching:
        return PrefixCachingKvManager(model, config)
    return PagedKvManager(model, config)


def make_policy(config: EngineConfig, planner: Planner) -> Policy:
    """The policy config.policy names, over the planner: "alternate" an
    AlternatePolicy (policy.py), "mixed" a MixedPolicy (mixed_policy.py, week 3 day
    1). The one place that reads config.policy."""
    if config.policy == "alternate":
        return AlternatePolicy(planner)
    return MixedPolicy(planner)


class Engine:
    """Continuous batching with chunked prefill, online.

    config: an EngineConfig; keyword `settings` replace its fields (Engine(model,
    tokenizer, batch_size=4, policy="mixed")). clock: every time in the metrics is a
    reading of it. on_forward: called with a ForwardRecord after every forward (for
    timelines).

    The state: model, tokenizer, config, clock, on_forward as given; kv
    (make_kv_manager); planner, the Planner; policy (make_policy); runner, your
    ModelRunner, or with config.step_ahead the given StepAheadRunner (step_ahead.py:
    decode forwards started a step ahead, drafts verified alone, same tokens); with
    speculative "learned" either keeps hidden states (week 4 day 3); reports, the Reports
    (reporting.py: the metrics, the ids until each request is reported finished);
    inbox, a queue.SimpleQueue of notes from add_request and abort; next_id: ids 0,
    1, 2, ...; arriving: (arrival_step, request) read, not admitted; steps_done;
    prefilling: the request whose chunk ran last step, prefill not done (snapshot):
    step() sets it to None before the plans run, run() after a chunk's forward.
    The peak memory is reset."""

    def __init__(
        self,
        model,
        tokenizer,
        config: EngineConfig | None = None,
        clock: Callable[[], float] = time.perf_counter,
        on_forward: Callable[[ForwardRecord], None] | None = None,
        **settings,
    ):
        config = EngineConfig.of(config, settings)
        config.check_model(model)
        check_callable("clock", clock, allow_none=False)
        self.model = model
        self.tokenizer = tokenizer
        self.config = config
        self.clock = clock
        self.on_forward = on_forward
        self.kv = make_kv_manager(model, config)
        self.planner = Planner(config, self.kv)
        self.policy = make_policy(config, self.planner)
        learned = config.speculative == "learned"
        self.runner = (
            StepAheadRunner(
                model, clock, self.kv, quiet=self.nothing_waits, keep_hidden=learned
            )
            if config.step_ahead
            else ModelRunner(model, clock, self.kv, keep_hidden=learned)
        )
        self.reports = Reports(clock, self.planner, self.policy, self.kv)
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.next_id = itertools.count()
        self.arriving: list[tuple[int, Request]] = []
        self.steps_done = 0
        self.prefilling: Request | None = None
        mx.reset_peak_memory()

    @property
    def metrics(self) -> RunMetrics:
        """The run's metrics (the reports')."""
        return self.reports.metrics

    @property
    def ids(self) -> dict[Request, int]:
        """Request -> id, for every request read and not yet reported finished."""
        return self.reports.ids

    @property
    def slots(self) -> tuple[Request | None, ...]:
        """The decode slots, read-only: the Request in slot i, or None."""
        return tuple(self.planner.slots)

    @property
    def waiting(self) -> tuple[Request, ...]:
        """The admitted requests not in a slot and not finished, read-only."""
        return tuple(self.planner.waiting)

    def add_request(self, prompt: str | list[int] | PromptSpec) -> int:
        """Queue a prompt (any thread); returns its request id.

        A plain prompt is PromptSpec(prompt). Its Requests are made here, one per
        choice (make_choices, choices.py: n > 1 makes n under the one id): a bad
        prompt has already failed ("error") and finishes in the engine's next step,
        costing nobody else anything. Only notes go into the inbox, one per Request,
        ("add", id, request, arrival_step): the engine's thread reads them.
        ValueError or TypeError for a bad arrival_step or n; the id is drawn
        (next_id) only after make_choices, so a refused prompt takes none.
        """
        raise NotImplementedError(
            "Week 2 Day 6 Task 4: add_request: check arrival_step; make_choices; put "
            '("add", id, request, arrival_step) in the inbox for each, return the id'
        )

    def abort(self, request_id: int, index: int | None = None) -> None:
        """Stop a request (any thread): within the next step it finishes with
        "abort" and frees its slot and memory, whether it waits, prefills or
        decodes; every choice of it, or only choice `index`. An unknown or finished
        id is ignored."""
        raise NotImplementedError(
            'Week 2 Day 6 Task 4: abort: put ("abort", id, index, None) in the inbox'
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
            "Week 2 Day 6 Task 4: has_unfinished: ids not empty, or the inbox not empty"
        )

    # ANCHOR: step
    def step(self) -> list[RequestOutput]:
        """One iteration: read the inbox, admit arrivals, run each plan the policy
        yields, and report what each request got. An interrupt raised by a plan
        still runs kv.after_step, then leaves step(): that step is not counted
        in steps_done and reports nothing."""
        raise NotImplementedError(
            "Week 2 Day 6 Task 4: step: reports.start, read_inbox, admit_arrivals, "
            "run each of policy.plans(), kv.after_step (in a finally), steps_done, "
            "the reports' count_requests and collect_outputs"
        )

    def run(self, plan: Plan) -> None:
        """Run a plan (nothing if it is empty), then retire the requests it finished
        or failed; an interrupt still retires them first. A forward that ran is
        recorded (reports.record, on_forward) and its time told to an
        AdaptiveChunker when it ran a chunk."""
        raise NotImplementedError(
            "Week 2 Day 6 Task 4: run: runner.run(plan), planner.retire_finished() "
            "even on an interrupt, prefilling; the forward to reports.record, the "
            "AdaptiveChunker and on_forward (reports.forward_record)"
        )

    # ANCHOR_END: step

    def read_inbox(self) -> None:
        """Take every note out of the inbox. ("add", id, request, arrival_step): the
        reports track it, and it goes into `arriving`. ("abort", id, index, None):
        abort_now(id, index)."""
        raise NotImplementedError(
            'Week 2 Day 6 Task 4: read_inbox: drain the inbox; "add" notes to '
            'reports.track and arriving; "abort" notes to abort_now'
        )

    def abort_now(self, request_id: int, index: int | None = None) -> None:
        """Abort a request now (the engine's thread): each of its choices (only
        choice `index` unless None) that is not finished finishes with "abort" and
        leaves wherever it is. An id that is unknown or already reported is
        ignored."""
        for request in choices_to_stop(self.ids, request_id, index):
            self.arriving = [(s, r) for s, r in self.arriving if r is not request]
            request.finish("abort")
        self.planner.retire_finished()

    def admit_arrivals(self) -> None:
        """Admit the requests whose arrival_step the steps done so far have reached;
        their arrival time is read now. A request that has already failed (a bad
        prompt) gets its arrival time but does not wait."""
        raise NotImplementedError(
            "Week 2 Day 6 Task 4: admit_arrivals: requests whose arrival_step is "
            "reached get their arrival time and join the planner"
        )

    def snapshot(self) -> SchedulerSnapshot:
        """The slots, the request prefilling and the counters, for live views
        (reports.snapshot)."""
        return self.reports.snapshot(self.steps_done, self.prefilling)
