"""The engines a benchmark runs, each driven the same way: requests are given to the
engine when they arrive (after a number of steps, or at a time), the engine steps
until every request is done or the run's time limit passes, and every generated
token's wall-clock time is kept.

Ours is the Engine of the package --solution chose (course.py), under policy
"alternate" or "mixed"; the peer is mlx-lm's BatchGenerator on the same float32
weights. EOS is masked out of the greedy sampler, so both do exactly the same work:
max_tokens for every request.

The loops every benchmark drives an Engine with live here once: run_to_end (add,
step until nothing is left) and drive (hand each request over when it arrives, abort
at the time limit); paged_engine is the paged benchmarks' Engine.
"""

import os
import time
from dataclasses import dataclass

import mlx.core as mx
from mlx_lm.generate import BatchGenerator, generate_step

from scripts.bench.benchlib.course import course
from tiny_llm_base import PromptSpec

from .measure import Run, summarize
from .workloads import Workload

BATCH_SIZE = 5


@dataclass(frozen=True)
class Config:
    """What one run serves with.

    engine: "ours" or "mlx-lm". policy: ours' "alternate" or "mixed" (mlx-lm always
    alternates). chunk: prefill tokens per chunk (alternate; mlx-lm's
    prefill_step_size), or one request's cap per step (mixed); None: whole prompts.
    budget: tokens per mixed step, decodes included; None: no limit.
    """

    engine: str
    policy: str
    chunk: int | None
    budget: int | None = None

    @property
    def label(self) -> str:
        if self.engine == "mlx-lm":
            return f"mlx-lm {name(self.chunk)}"
        if self.policy == "alternate":
            return f"alternate {name(self.chunk)}"
        cap = "" if self.chunk is None else f"/{self.chunk}"
        return f"mixed {name(self.budget)}{cap}"


def name(size: int | None) -> str:
    return "none" if size is None else str(size)


def parse_size(text: str) -> int | None:
    """A token count of at least 1, or "none" (also written as nothing)."""
    if text.strip().lower() in ("none", ""):
        return None
    if not text.strip().isdigit() or int(text) < 1:
        raise ValueError(
            f"a size must be a number of tokens >= 1 or none, got {text!r}"
        )
    return int(text)


def parse_config(text: str) -> Config:
    """ "alternate:128", "mixed:256", "mixed:none/128" (budget/cap), "mlx-lm:512"."""
    kind, _, size = text.strip().partition(":")
    if kind in ("alt", "alternate"):
        return Config("ours", "alternate", parse_size(size))
    if kind == "mixed":
        budget, _, cap = size.partition("/")
        return Config("ours", "mixed", parse_size(cap), parse_size(budget))
    if kind in ("mlx", "mlx-lm"):
        return Config("mlx-lm", "alternate", parse_size(size))
    raise ValueError(
        f"unknown configuration {text!r}: write alternate:CHUNK, mixed:BUDGET[/CAP] "
        "or mlx-lm:CHUNK, with a number or none"
    )


class Arrivals:
    """Which requests have arrived: after `arrival_steps` engine steps, or at
    start + arrival_s. A request's arrival time is the time it was due (timed) or the
    time it was handed over (by step); None for one that never arrived."""

    def __init__(self, workload: Workload, start: float):
        self.workload = workload
        self.start = start
        self.left = list(range(len(workload.prompts)))
        self.times: list[float | None] = [None] * len(workload.prompts)

    def due(self, steps: int, now: float, idle: bool) -> list[int]:
        """The requests to hand over now; an idle engine gets the next one by step at
        once (no step would ever come)."""
        w = self.workload
        if w.arrival_s is not None:
            ready = [i for i in self.left if self.start + w.arrival_s[i] <= now]
            for i in ready:
                self.times[i] = self.start + w.arrival_s[i]
        else:
            if idle and self.left:
                steps = max(steps, min(w.arrival_steps[i] for i in self.left))
            ready = [i for i in self.left if w.arrival_steps[i] <= steps]
            for i in ready:
                self.times[i] = now
        self.left = [i for i in self.left if i not in ready]
        return ready

    def wait(self, now: float) -> None:
        """Sleep until the next timed arrival (an idle engine has nothing to do)."""
        if self.workload.arrival_s is not None and self.left:
            next_time = self.start + min(self.workload.arrival_s[i] for i in self.left)
            time.sleep(max(0.0, next_time - now))


def paged_engine(model, tokenizer, **settings):
    """Ours as the paged-cache benchmarks run it: one mixed step a step on the paged
    cache, 512-token chunks; `settings` add to or replace those."""
    paged = dict(policy="mixed", kv_cache="paged", prefill_step=512)
    return course.Engine(model, tokenizer, **{**paged, **settings})


def peak_memory_run(model, tokenizer, specs, **settings) -> tuple[int, list]:
    """MLX's peak memory above the start while the specs run through a fresh
    Engine of these settings, and their tokens."""
    mx.clear_cache()
    mx.reset_peak_memory()
    start = mx.get_active_memory()
    results = run_to_end(course.Engine(model, tokenizer, **settings), specs)
    peak = mx.get_peak_memory() - start
    mx.clear_cache()
    return peak, [r.tokens for r in results]


def all_decoding(engine, specs) -> None:
    """The specs added, the engine stepped until every one of them decodes: a full
    batch held before the request a benchmark times arrives."""
    for spec in specs:
        engine.add_request(spec)
    while len(engine.planner.decoding()) < len(specs):
        engine.step()


def run_to_end(engine, specs=(), on_step=None) -> list:
    """The specs added, the engine stepped until nothing is left; returns the results
    of every request that finished, in the order added (request ids count up).
    on_step(engine, outputs, seconds) after each step (it may add requests)."""
    for spec in specs:
        engine.add_request(spec)
    results = {}
    while engine.has_unfinished():
        start = time.perf_counter()
        outputs = engine.step()
        seconds = time.perf_counter() - start
        for output in outputs:
            if output.result is not None:
                results[output.request_id] = output.result
        if on_step is not None:
            on_step(engine, outputs, seconds)
    return [results[i] for i in sorted(results)]


@dataclass
class Drive:
    """What drive() saw: its clock readings, when each request arrived (None: never)
    and its result (None: cut by the time limit), and the engine's request ids."""

    start: float
    end: float
    arrivals: list[float | None]
    results: list
    index_of: dict[int, int]


def drive(engine, workload: Workload, time_limit_s: float, **spec) -> Drive:
    """The workload through the engine, each request handed over when it arrives
    (an idle engine sleeps until the next); past time_limit_s what is left is
    aborted. spec: more PromptSpec fields (priority="interactive", say)."""
    index_of: dict[int, int] = {}
    results = [None] * len(workload.prompts)
    start = time.perf_counter()
    arrivals = Arrivals(workload, start)
    while arrivals.left or engine.has_unfinished():
        now = time.perf_counter()
        late = now - start > time_limit_s
        if late:
            for request_id in index_of:
                engine.abort(request_id)
        else:
            idle = not engine.has_unfinished()
            for i in arrivals.due(engine.steps_done, now, idle):
                prompt, max_tokens = workload.prompts[i], workload.max_tokens[i]
                request = PromptSpec(prompt, max_tokens=max_tokens, **spec)
                index_of[engine.add_request(request)] = i
            if not engine.has_unfinished():
                arrivals.wait(now)
                continue
        for output in engine.step():
            if output.result is not None:
                results[index_of[output.request_id]] = output.result
        if late:
            break
    return Drive(start, time.perf_counter(), arrivals.times, results, index_of)


def run_ours(
    model,
    tokenizer,
    workload: Workload,
    config: Config,
    sampler,
    time_limit_s: float,
    batch_size: int = BATCH_SIZE,
    **settings,
) -> Run:
    """The chosen package's Engine through the workload (drive); ForwardRecords are
    kept for the timeline. settings: more EngineConfig fields (speculative="ngram",
    say)."""
    load = os.getloadavg()[0]
    base = mx.get_active_memory()
    records = []
    engine = course.Engine(
        model,
        tokenizer,
        batch_size=batch_size,
        max_seq_len=workload.max_seq_len,
        prefill_step=config.chunk,
        policy=config.policy,
        token_budget=config.budget,
        sampler=sampler,
        on_forward=records.append,
        **settings,
    )
    run = drive(engine, workload, time_limit_s)
    index_of = run.index_of
    forwards = [
        {
            "start": r.start - run.start,
            "end": r.end - run.start,
            "chunks": [(index_of[i], tokens) for i, tokens in r.chunks],
            "decodes": [index_of[i] for i in r.decodes],
            "drafts": [(index_of[i], fed, kept) for i, fed, kept in r.drafts],
        }
        for r in records
    ]
    results = run.results
    return summarize(
        config.label,
        "ours",
        workload,
        run.start,
        run.end,
        run.arrivals,
        [r.metrics.token_times if r else [] for r in results],
        [r.tokens if r else [] for r in results],
        [r is not None and r.finish_reason in ("stop", "length") for r in results],
        mx.get_peak_memory() - base,
        (load, os.getloadavg()[0]),
        forwards,
    )


def run_mlx_lm(
    peer, workload: Workload, config: Config, sampler, time_limit_s: float
) -> Run:
    """mlx-lm's BatchGenerator: one prompt prefilled at a time, BATCH_SIZE decode
    slots; one next() per step (a decode step, then a prefill chunk)."""
    n = len(workload.prompts)
    longest = max(len(p) for p in workload.prompts)
    generator = BatchGenerator(
        peer,
        sampler=sampler,
        completion_batch_size=BATCH_SIZE,
        prefill_batch_size=1,
        prefill_step_size=config.chunk or longest + 1,
    )
    load = os.getloadavg()[0]
    mx.reset_peak_memory()
    base = mx.get_active_memory()
    index_of: dict[int, int] = {}
    token_times: list[list[float]] = [[] for _ in range(n)]
    tokens: list[list[int]] = [[] for _ in range(n)]
    finished = [False] * n
    in_flight = steps = 0
    start = time.perf_counter()
    arrivals = Arrivals(workload, start)
    while arrivals.left or in_flight:
        now = time.perf_counter()
        if now - start > time_limit_s:
            break
        arrived = arrivals.due(steps, now, idle=not in_flight)
        if arrived:
            uids = generator.insert(
                [workload.prompts[i] for i in arrived],
                [workload.max_tokens[i] for i in arrived],
            )
            index_of.update(zip(uids, arrived))
            in_flight += len(arrived)
        if not in_flight:
            arrivals.wait(now)
            continue
        _, responses = generator.next()
        now = time.perf_counter()
        for response in responses:
            i = index_of[response.uid]
            token_times[i].append(now)
            tokens[i].append(response.token)
            finished[i] = response.finish_reason is not None
            in_flight -= finished[i]
        steps += 1
    end = time.perf_counter()
    peak = mx.get_peak_memory() - base
    generator.close()
    return summarize(
        config.label,
        "mlx-lm",
        workload,
        start,
        end,
        arrivals.times,
        token_times,
        tokens,
        finished,
        peak,
        (load, os.getloadavg()[0]),
    )


def run_mlx_lm_alone(
    peer, eos_ids, workload: Workload, label: str, time_limit_s: float
) -> Run:
    """mlx-lm's own generation (generate_step, greedy), one request after another:
    each arrives when the previous ends and stops at EOS or max_tokens."""
    n = len(workload.prompts)
    eos = set(eos_ids)
    load = os.getloadavg()[0]
    mx.reset_peak_memory()
    base = mx.get_active_memory()
    token_times: list[list[float]] = [[] for _ in range(n)]
    tokens: list[list[int]] = [[] for _ in range(n)]
    arrivals: list[float | None] = [None] * n
    finished = [False] * n
    start = time.perf_counter()
    for i, (prompt, max_tokens) in enumerate(
        zip(workload.prompts, workload.max_tokens)
    ):
        if time.perf_counter() - start > time_limit_s:
            break
        arrivals[i] = time.perf_counter()
        for token, _ in generate_step(mx.array(prompt), peer, max_tokens=max_tokens):
            if token in eos:
                break
            token_times[i].append(time.perf_counter())
            tokens[i].append(token)
        finished[i] = True
    end = time.perf_counter()
    return summarize(
        label,
        "mlx-lm",
        workload,
        start,
        end,
        arrivals,
        token_times,
        tokens,
        finished,
        mx.get_peak_memory() - base,
        (load, os.getloadavg()[0]),
    )
