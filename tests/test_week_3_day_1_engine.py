"""Week 3 Day 1: the online engine, under both policies.

Every generated token is compared with mlx-lm's own models generating each prompt
alone (greedy, float32): random Qwen2 and Llama models at unusual sizes
(tests/random_models.py) and the embedded SmolLM2 dequantized to float32 on both
sides. Whatever the policy, token budget, batch size, arrival time, abort or failure
around it, a request must get mlx-lm's tokens (a divergence is accepted only where
mlx-lm's best two logits nearly tie). What the engine reports about itself (outputs,
ForwardRecords, metrics) is checked against the prompts it was given, the tokens it
returned and the schedule's rules, never against an earlier run.

Besides its methods, the tests read the engine's state where the chapter names it:
`slots` (the request in each decode slot, or None), `waiting` (requests admitted but
not in a slot) and `cache` (one BatchingKvCache per layer).
"""

import random
import threading
import time
from collections import defaultdict

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tiny_llm_base.mlx_lm_reference import mlx_lm_greedy

from .helpers import (
    WAIT_S,
    assert_prompt_logprobs,
    assert_same_tokens,
    assert_token_logprob,
    expected_tokens,
    mlx_lm_logprobs,
    token_ids,
)
from .solution import tiny

# (policy, token_budget): the alternating schedule, the smallest budget a batch of
# two slots allows (one prefill token beside two decodes), and no budget at all.
POLICIES = [("alternate", None), ("mixed", 3), ("mixed", None)]
POLICY_IDS = ["alternate", "mixed-budget-3", "mixed-unlimited"]
FINISH_REASONS = {"stop", "length", "max_seq_len", "abort", "error"}
MAX_STEPS = 2000


# --- references and helpers -------------------------------------------------------


def eos_first(tokenizer):
    """A sampler that always answers EOS: its request stops at its first token."""
    eos = min(tokenizer.eos_token_ids)
    return lambda logprobs: mx.array([eos])


class Recorder:
    """Steps an engine and keeps what it reported: every output, per request id, and
    every ForwardRecord (give the engine on_forward=recorder.records.append)."""

    def __init__(self):
        self.outputs = defaultdict(list)
        self.records = []
        self.steps = 0

    def step(self, engine) -> list:
        outputs = engine.step()
        self.steps += 1
        for output in outputs:
            assert not self.finished(output.request_id), (
                f"request {output.request_id} got an output after its finishing one"
            )
            self.outputs[output.request_id].append(output)
        return outputs

    def run(self, engine, check=None) -> None:
        """Step until the engine has nothing left; `check(engine)` after each step."""
        for _ in range(MAX_STEPS):
            if not engine.has_unfinished():
                return
            self.step(engine)
            if check is not None:
                check(engine)
        pytest.fail(f"the engine still had unfinished requests after {MAX_STEPS} steps")

    def finished(self, request_id: int) -> bool:
        outputs = self.outputs.get(request_id, [])
        return bool(outputs) and outputs[-1].finish_reason is not None

    def tokens(self, request_id: int) -> list[int]:
        return [t for output in self.outputs.get(request_id, []) for t in output.tokens]

    def result(self, request_id: int):
        assert self.finished(request_id), f"request {request_id} never finished"
        return self.outputs[request_id][-1].result

    def chunks(self, request_id: int) -> list[int]:
        return [n for r in self.records for i, n in r.chunks if i == request_id]

    def in_decodes(self, request_id: int) -> list[int]:
        return [n for n, r in enumerate(self.records) if request_id in r.decodes]


def check_outputs(recorder: Recorder, ids) -> None:
    """Each request got exactly one finishing output, its last, holding its result;
    the outputs before it each brought tokens; the tokens and text deltas of all its
    outputs add up to the result's tokens and text."""
    for request_id in ids:
        outputs = recorder.outputs[request_id]
        finishing = [o for o in outputs if o.finish_reason is not None]
        assert len(finishing) == 1 and finishing[0] is outputs[-1], (
            f"request {request_id}: finish reasons "
            f"{[o.finish_reason for o in outputs]}: exactly one, in its last output"
        )
        for output in outputs[:-1]:
            assert output.tokens and output.result is None, (
                f"request {request_id}: an output before the last must bring tokens "
                "and no result"
            )
        result = outputs[-1].result
        assert result is not None and result.finish_reason == outputs[-1].finish_reason
        assert result.finish_reason in FINISH_REASONS
        assert [t for o in outputs for t in o.tokens] == result.tokens
        assert "".join(o.text for o in outputs) == result.text


def assert_caches_follow_slots(engine, recorder: Recorder, prompt_lengths) -> None:
    """Every layer's batch cache holds each slot's sequence and nothing else: a slot
    in use holds its prompt and every generated token but the last (not fed yet;
    fed already when its row is in the forward the runner started a step ahead,
    step_ahead.py), a free slot nothing, and the cache feeds rows up to the highest
    slot in use."""
    slots = engine.snapshot().slots
    assert len(slots) == engine.config.batch_size
    ahead = getattr(engine.runner, "ahead", None)
    in_ahead = [] if ahead is None else ahead.rows  # finished ones: ignored rows
    fed = [engine.ids[r] for r in in_ahead if r in engine.ids]
    expected = [
        0
        if view is None
        else prompt_lengths[view.request]
        + len(recorder.tokens(view.request))
        - (view.request not in fed)
        for view in slots
    ]
    for request, view in zip(engine.slots, slots):
        assert (request is None) == (view is None)
    rows = max((slot + 1 for slot, n in enumerate(expected) if n), default=0)
    for layer, cache in enumerate(engine.kv.batch_cache):
        assert list(cache.offset) == expected, f"layer {layer}"
        assert cache.rows == rows, f"layer {layer}"


def assert_engine_empty(engine) -> None:
    """Nothing left and nothing held: no request, every slot free, every layer's batch
    cache empty and without storage."""
    assert not engine.has_unfinished()
    assert engine.slots == (None,) * engine.config.batch_size
    assert engine.waiting == ()
    for layer, cache in enumerate(engine.kv.batch_cache):
        assert cache.rows == 0, f"layer {layer}"
        assert list(cache.offset) == [0] * engine.config.batch_size, f"layer {layer}"
        assert cache.keys is None and cache.values is None, (
            f"layer {layer}: an empty batch cache keeps no storage"
        )
    snapshot = engine.snapshot()
    assert snapshot.slots == [None] * engine.config.batch_size
    assert snapshot.prefilling is None
    assert engine.metrics.running == 0 and engine.metrics.waiting == 0


def check_forwards(
    recorder: Recorder,
    ids,
    prompt_lengths,
    policy: str,
    token_budget: int | None,
    prefill_step: int | None,
    batch_size: int,
) -> None:
    """What each forward ran, against the schedule's rules.

    Every prompt is prefilled exactly once (a preempted request's again per
    preemption, its decodes then unchecked), in chunks of at most prefill_step; a
    mixed forward holds at most token_budget tokens (a chunk's tokens and one per
    decode); an alternate step runs a forward for one chunk, then one for the
    decodes. Decodes are never starved: a request decodes in every forward (every
    decode forward, alternating) from the one after its last chunk until it
    finishes, once per token after its first (and once more for an EOS).
    """
    records = recorder.records
    for number, record in enumerate(records):
        what = f"forward {number}: {record}"
        assert record.start <= record.end, what
        chunk_ids = [i for i, _ in record.chunks]
        assert len(set(chunk_ids)) == len(chunk_ids), what
        assert all(n >= 1 for _, n in record.chunks), what
        if prefill_step is not None:
            assert all(n <= prefill_step for _, n in record.chunks), what
        assert len(set(record.decodes)) == len(record.decodes) <= batch_size, what
        if policy == "alternate":
            one_chunk = len(record.chunks) == 1 and not record.decodes
            assert one_chunk or (record.decodes and not record.chunks), (
                what + ": one chunk, or the decodes"
            )
        else:
            assert record.chunks or record.decodes, what
            tokens = sum(n for _, n in record.chunks) + len(record.decodes)
            assert token_budget is None or tokens <= token_budget, (
                f"{what}: {tokens} tokens, over the budget of {token_budget}"
            )
    eligible = [
        n for n, r in enumerate(records) if policy == "mixed" or r.decodes
    ]  # the forwards a decoding request must be in
    for request_id in ids:
        result = recorder.result(request_id)
        preemptions = result.metrics.preemptions
        if preemptions:  # recomputed: its prompt and what it had generated, again
            assert sum(recorder.chunks(request_id)) >= (
                (1 + preemptions) * prompt_lengths[request_id]
            ), f"request {request_id}: preempted {preemptions} times"
            continue
        assert sum(recorder.chunks(request_id)) == prompt_lengths[request_id], (
            f"request {request_id}: its chunks must cover its prompt exactly once"
        )
        decoded = len(result.tokens) - 1 + (result.finish_reason == "stop")
        last_chunk = max(
            n for n, r in enumerate(records) if request_id in dict(r.chunks)
        )
        following = [n for n in eligible if n > last_chunk][:decoded]
        assert recorder.in_decodes(request_id) == following, (
            f"request {request_id} ({len(result.tokens)} tokens, "
            f"{result.finish_reason}): it must decode in each of the {decoded} "
            f"forwards after its last chunk (forward {last_chunk})"
        )


# --- the property: no schedule changes the tokens ----------------------------------


@pytest.mark.task(4)
@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_engine_tokens_do_not_depend_on_policy_budget_or_batch(
    random_pairs, tokenizer, data
):
    index = data.draw(st.integers(0, len(random_pairs) - 1), label="model")
    mlx_model, model = random_pairs[index]
    vocab = mlx_model.args.vocab_size
    batch_size = data.draw(st.integers(1, 5), label="batch_size")
    policy = data.draw(st.sampled_from(["alternate", "mixed"]), label="policy")
    token_budget = None
    if policy == "mixed":
        token_budget = data.draw(
            st.sampled_from([batch_size + 1, 16, 64, 256, None]), label="token_budget"
        )
    prefill_step = data.draw(st.sampled_from([1, 3, 8, 32, None]), label="step")
    prompts = data.draw(
        st.lists(
            st.lists(st.integers(0, vocab - 1), min_size=1, max_size=40),
            min_size=1,
            max_size=7,
        ),
        label="prompts",
    )
    specs = [
        tiny.PromptSpec(
            prompt,
            priority=data.draw(st.sampled_from(["batch", "interactive"])),
            arrival_step=data.draw(st.integers(0, 4)),
        )
        for prompt in prompts
    ]
    max_tokens = data.draw(st.integers(1, 6), label="max_tokens")
    step_ahead = data.draw(st.booleans(), label="step_ahead")
    recorder = Recorder()
    engine = tiny.Engine(
        model,
        tokenizer,
        batch_size=batch_size,
        max_seq_len=64,
        prefill_step=prefill_step,
        policy=policy,
        token_budget=token_budget,
        max_tokens=max_tokens,
        on_forward=recorder.records.append,
        step_ahead=step_ahead,
    )
    ids = [engine.add_request(spec) for spec in specs]
    assert len(set(ids)) == len(ids)
    recorder.run(engine)
    check_outputs(recorder, ids)
    expected = expected_tokens(mlx_model, prompts, max_tokens, tokenizer)
    for i, (request_id, (tokens, gaps)) in enumerate(zip(ids, expected)):
        result = recorder.result(request_id)
        assert_same_tokens(result.tokens, tokens, gaps, f"prompt {i}")
        assert result.finish_reason in ("stop", "length")
    lengths = {i: len(p) for i, p in zip(ids, prompts)}
    check_forwards(
        recorder, ids, lengths, policy, token_budget, prefill_step, batch_size
    )
    assert_engine_empty(engine)


EMBEDDED_TEXTS = [
    "The capital of France is",
    "Here are my notes from a week of baking. On Monday the sourdough starter "
    "bubbled slowly, so I fed it twice with rye flour.",
    "Red, green and",
]


def streamed_text(tokenizer, tokens: list[int]) -> str:
    """mlx-lm's streaming detokenizer's text for `tokens` (it drops the leading space
    of the first token, so it differs from tokenizer.decode there)."""
    detokenizer = tokenizer.detokenizer
    for token in tokens:
        detokenizer.add_token(token)
    detokenizer.finalize()
    return detokenizer.text


@pytest.fixture(scope="module")
def embedded_case(embedded_model, embedded_week2_model, embedded_float32_reference):
    """The float32 tiny model, prompts of 4 to 29 tokens, and mlx-lm's tokens for
    each alone on the same float32 weights."""
    mlx_model, tokenizer = embedded_model
    model = embedded_week2_model(True)
    prompts = [tokenizer.encode(text) for text in EMBEDDED_TEXTS]
    expected = expected_tokens(embedded_float32_reference, prompts, 4, tokenizer)
    return model, tokenizer, prompts, expected


@pytest.mark.task(3)
@pytest.mark.parametrize(
    "policy, token_budget, batch_size, prefill_step",
    [
        ("alternate", None, 2, 8),
        ("mixed", "batch_size + 1", 2, None),
        ("mixed", 16, 3, 8),
    ],
)
def test_embedded_model_matches_mlx_lm(
    embedded_case, policy, token_budget, batch_size, prefill_step
):
    model, tokenizer, prompts, expected = embedded_case
    if token_budget == "batch_size + 1":
        token_budget = batch_size + 1
    results = tiny.batch_generate(
        model,
        tokenizer,
        prompts,
        batch_size=batch_size,
        prefill_step=prefill_step,
        max_seq_len=128,
        max_tokens=4,
        policy=policy,
        token_budget=token_budget,
    )
    for i, (result, (tokens, gaps)) in enumerate(zip(results, expected)):
        assert_same_tokens(result.tokens, tokens, gaps, f"prompt {i}")
        assert result.text == streamed_text(tokenizer, result.tokens)
    assert results.metrics.prefill_tokens == sum(len(p) for p in prompts)


# --- online: requests come and go while the engine runs ----------------------------


@pytest.mark.task(3)
@pytest.mark.parametrize("policy, token_budget", POLICIES, ids=POLICY_IDS)
def test_requests_added_between_steps(pair, tokenizer, no_eos, policy, token_budget):
    mlx_model, model = pair
    sampler, banned = no_eos
    rng = np.random.default_rng(20)
    prompts = [token_ids(rng, mlx_model.args.vocab_size, n) for n in (12, 5, 9, 3, 7)]
    recorder = Recorder()
    engine = tiny.Engine(
        model,
        tokenizer,
        batch_size=2,
        prefill_step=4,
        policy=policy,
        token_budget=token_budget,
        max_tokens=5,
        sampler=sampler,
        on_forward=recorder.records.append,
        batch_patience=0,  # arrival order: no priority preemption (mixed_policy.py)
    )
    lengths = {}

    def add(number: int, priority: str = "batch") -> int:
        request_id = engine.add_request(
            tiny.PromptSpec(prompts[number], priority=priority)
        )
        lengths[request_id] = len(prompts[number])
        return request_id

    def check(engine) -> None:
        assert_caches_follow_slots(engine, recorder, lengths)

    ids = [add(0), add(1)]
    for _ in range(100):
        recorder.step(engine)
        check(engine)
        if any(recorder.tokens(i) for i in ids):
            break  # the first requests are running
    ids += [add(2), add(3, "interactive")]
    for _ in range(2):
        recorder.step(engine)
        check(engine)
    ids.append(add(4))
    recorder.run(engine, check)
    check_outputs(recorder, ids)
    expected = expected_tokens(mlx_model, prompts, 5, tokenizer, banned)
    for i, (request_id, (tokens, gaps)) in enumerate(zip(ids, expected)):
        assert_same_tokens(recorder.result(request_id).tokens, tokens, gaps, f"{i}")
    check_forwards(recorder, ids, lengths, policy, token_budget, 4, 2)
    assert_engine_empty(engine)


@pytest.mark.task(3)
@pytest.mark.parametrize("policy, token_budget", POLICIES, ids=POLICY_IDS)
def test_requests_added_and_aborted_from_another_thread(
    pair, tokenizer, no_eos, policy, token_budget
):
    """A client thread adds three requests, waits until the engine's loop has
    produced a token, then adds three more and aborts two: one running (40 tokens
    long), one just added. Each request finishes once; the ones not aborted get mlx-lm's tokens, the
    aborted ones a prefix of them (or all of them, had they finished first)."""
    mlx_model, model = pair
    sampler, banned = no_eos
    rng = np.random.default_rng(21)
    prompts = [
        token_ids(rng, mlx_model.args.vocab_size, n) for n in (9, 4, 15, 6, 11, 3)
    ]
    max_tokens = [6, 40, 6, 6, 6, 6]
    specs = [tiny.PromptSpec(p, max_tokens=n) for p, n in zip(prompts, max_tokens)]
    engine = tiny.Engine(
        model,
        tokenizer,
        batch_size=2,
        prefill_step=4,
        policy=policy,
        token_budget=token_budget,
        sampler=sampler,
    )
    ids: dict[int, int] = {}
    running = threading.Event()
    all_added = threading.Event()
    aborted = (1, 4)

    def client() -> None:
        for number in range(3):
            ids[number] = engine.add_request(specs[number])
        running.wait(timeout=WAIT_S)
        for number in range(3, 6):
            ids[number] = engine.add_request(specs[number])
            time.sleep(0.002)
            if number == 4:
                engine.abort(ids[1])
                engine.abort(ids[4])
        all_added.set()

    thread = threading.Thread(target=client)
    recorder = Recorder()
    thread.start()
    deadline = time.monotonic() + WAIT_S
    try:
        while not all_added.is_set() or engine.has_unfinished():
            assert time.monotonic() < deadline, f"the loop ran past {WAIT_S} s"
            for output in recorder.step(engine):
                if output.tokens:
                    running.set()
    finally:
        running.set()
        thread.join(timeout=WAIT_S)
    assert not thread.is_alive()
    assert sorted(ids) == list(range(6)) and len(set(ids.values())) == 6
    check_outputs(recorder, ids.values())
    for number, (prompt, count) in enumerate(zip(prompts, max_tokens)):
        ((tokens, gaps),) = expected_tokens(
            mlx_model, [prompt], count, tokenizer, banned
        )
        result = recorder.result(ids[number])
        if number in aborted and result.finish_reason == "abort":
            assert len(result.tokens) < count
            tokens = tokens[: len(result.tokens)]
        else:
            assert result.finish_reason == "length", f"prompt {number}"
        assert_same_tokens(result.tokens, tokens, gaps, f"prompt {number}")
    assert recorder.result(ids[1]).finish_reason == "abort", (
        "request 1 was running when the client aborted it"
    )
    assert_engine_empty(engine)


ABORT_MOMENTS = [
    "before_any_step",
    "not_admitted",
    "waiting_for_slot",
    "mid_prefill",
    "mid_decode",
]


@pytest.mark.task(3)
@pytest.mark.parametrize("policy, token_budget", POLICIES, ids=POLICY_IDS)
@pytest.mark.parametrize("moment", ABORT_MOMENTS)
def test_abort(pair, tokenizer, no_eos, policy, token_budget, moment):
    """Two slots; requests A and B run beside the victim X (14 prompt tokens, chunks
    of 3, 6 tokens), which is aborted at `moment`; C comes after the abort. X finishes with
    "abort" in the next step, holding a prefix of mlx-lm's tokens, and never runs
    again; its slot goes to another request; A, B and C get mlx-lm's tokens."""
    mlx_model, model = pair
    sampler, banned = no_eos
    rng = np.random.default_rng(22)
    vocab = mlx_model.args.vocab_size
    prompts = {name: token_ids(rng, vocab, n) for name, n in zip("ABXC", (4, 7, 14, 5))}
    # B outlives X: X's slot is the one free when C (or B) next takes one.
    max_tokens = {"A": 10, "B": 30, "X": 6, "C": 4}
    recorder = Recorder()
    engine = tiny.Engine(
        model,
        tokenizer,
        batch_size=2,
        prefill_step=3,
        policy=policy,
        token_budget=token_budget,
        sampler=sampler,
        on_forward=recorder.records.append,
    )
    ids, lengths = {}, {}

    def add(name: str, arrival_step: int = 0) -> None:
        spec = tiny.PromptSpec(
            prompts[name], max_tokens=max_tokens[name], arrival_step=arrival_step
        )
        ids[name] = engine.add_request(spec)
        lengths[ids[name]] = len(prompts[name])

    def check(engine) -> None:
        assert_caches_follow_slots(engine, recorder, lengths)

    def step_until(condition, what: str) -> None:
        for _ in range(100):
            if condition():
                return
            recorder.step(engine)
            check(engine)
        pytest.fail(f"never reached: {what}")

    def slots() -> list:
        return [None if v is None else v.request for v in engine.snapshot().slots]

    x_slot = None
    if moment == "before_any_step":
        for name in "AXB":
            add(name)
    elif moment == "not_admitted":
        add("A")
        add("X", arrival_step=10_000)
        add("B")
        step_until(lambda: recorder.steps >= 3, "three steps")
    elif moment == "waiting_for_slot":
        add("A")
        add("B")
        step_until(lambda: None not in slots(), "A and B in both slots")
        add("X")
        for _ in range(2):
            recorder.step(engine)
            check(engine)
        assert not recorder.chunks(ids["X"]), "no slot: X must not prefill yet"
    elif moment == "mid_prefill":
        for name in "AXB":
            add(name)
        step_until(lambda: len(recorder.chunks(ids["X"])) >= 2, "two chunks of X")
        assert sum(recorder.chunks(ids["X"])) < len(prompts["X"])
    else:
        for name in "AXB":
            add(name)
        step_until(lambda: len(recorder.tokens(ids["X"])) >= 2, "two tokens of X")
        assert not recorder.finished(ids["X"])
        x_slot = slots().index(ids["X"])
    tokens_before = recorder.tokens(ids["X"])
    forwards_before = len(recorder.records)
    engine.abort(ids["X"])
    assert engine.has_unfinished()
    outputs = recorder.step(engine)
    check(engine)
    (x_output,) = [o for o in outputs if o.request_id == ids["X"]]
    assert x_output.finish_reason == "abort" and x_output.tokens == []
    assert x_output.result.finish_reason == "abort"
    assert x_output.result.tokens == tokens_before
    assert ids["X"] not in slots()
    assert all(ids["X"] not in r.decodes for r in recorder.records[forwards_before:])
    assert all(
        ids["X"] not in dict(r.chunks) for r in recorder.records[forwards_before:]
    )
    if moment in ("before_any_step", "not_admitted", "waiting_for_slot"):
        assert tokens_before == [] and not recorder.chunks(ids["X"])
    add("C")
    reused = set()

    def check_and_watch(engine) -> None:
        check(engine)
        if x_slot is not None:
            reused.add(slots()[x_slot])

    recorder.run(engine, check_and_watch)
    if x_slot is not None:
        assert reused - {None}, f"nobody took slot {x_slot} after X left it"
    # Already finished, or never given out: an abort is ignored.
    engine.abort(ids["X"])
    engine.abort(10**9)
    assert recorder.step(engine) == []
    check_outputs(recorder, ids.values())
    for name in "ABC":
        ((tokens, gaps),) = expected_tokens(
            mlx_model, [prompts[name]], max_tokens[name], tokenizer, banned
        )
        result = recorder.result(ids[name])
        assert_same_tokens(result.tokens, tokens, gaps, name)
        assert result.finish_reason == "length"
    ((tokens, gaps),) = expected_tokens(mlx_model, [prompts["X"]], 6, tokenizer, banned)
    assert_same_tokens(tokens_before, tokens[: len(tokens_before)], gaps, "X")
    assert_engine_empty(engine)


@pytest.mark.task(4)
@pytest.mark.parametrize("policy, token_budget", POLICIES, ids=POLICY_IDS)
def test_random_adds_aborts_and_finishes_leak_nothing(
    random_pairs, tokenizer, policy, token_budget
):
    """200 random events (seeded): add a request (a random prompt, max_tokens,
    priority and arrival; now and then one whose sampler answers EOS at once, or an
    empty prompt), abort any id (waiting, prefilling, decoding, finished, unknown), or
    step. Then every request has finished exactly once, the ones not aborted with
    mlx-lm's tokens, and every slot and cache row is free."""
    mlx_model, model = random_pairs[1]
    vocab = mlx_model.args.vocab_size
    rng = random.Random(f"leak {policy} {token_budget}")
    recorder = Recorder()
    engine = tiny.Engine(
        model,
        tokenizer,
        batch_size=3,
        max_seq_len=40,
        prefill_step=4,
        policy=policy,
        token_budget=None if token_budget is None else 4,  # the smallest for 3 slots
        on_forward=recorder.records.append,
    )
    specs, lengths, abort_called = {}, {}, set()
    for _ in range(200):
        event = rng.choices(["add", "abort", "step"], weights=[2, 1, 3])[0]
        if event == "add":
            kind = rng.choices(["greedy", "eos_first", "empty"], weights=[8, 1, 1])[0]
            prompt = [rng.randrange(vocab) for _ in range(rng.randint(1, 24))]
            spec = tiny.PromptSpec(
                [] if kind == "empty" else prompt,
                max_tokens=rng.randint(1, 6),
                sampler=eos_first(tokenizer) if kind == "eos_first" else None,
                priority=rng.choice(["batch", "interactive"]),
                arrival_step=recorder.steps + rng.choice([0, 0, 0, 2]),
            )
            request_id = engine.add_request(spec)
            specs[request_id], lengths[request_id] = spec, len(spec.prompt)
        elif event == "abort" and specs:
            unfinished = [i for i in specs if not recorder.finished(i)]
            if unfinished and rng.random() < 0.8:
                request_id = rng.choice(unfinished)
            else:  # finished, or never given out: ignored
                request_id = rng.choice([*specs, 10**6])
            if not recorder.finished(request_id):
                abort_called.add(request_id)
            engine.abort(request_id)
        else:
            recorder.step(engine)
            assert_caches_follow_slots(engine, recorder, lengths)
    recorder.run(
        engine, lambda engine: assert_caches_follow_slots(engine, recorder, lengths)
    )
    check_outputs(recorder, specs)
    assert set(recorder.outputs) == set(specs), "an output for an unknown id"
    aborted_at = {"waiting": 0, "prefilling": 0, "decoding": 0}
    for request_id, spec in specs.items():
        result = recorder.result(request_id)
        what = f"request {request_id} ({result.finish_reason})"
        if not spec.prompt:
            assert result.finish_reason == "error" and result.error, what
            continue
        assert result.error is None, what
        if result.finish_reason == "abort":
            assert request_id in abort_called, what + ": nobody aborted it"
            state = "decoding" if result.tokens else "waiting"
            if recorder.chunks(request_id) and not result.tokens:
                state = "prefilling"
            aborted_at[state] += 1
        if spec.sampler is not None:
            assert result.finish_reason in ("stop", "abort"), what
            assert result.tokens == [], what
            continue
        tokens, gaps = mlx_lm_greedy(
            mlx_model, spec.prompt, spec.max_tokens, tokenizer.eos_token_ids
        )
        if result.finish_reason == "abort":
            tokens = tokens[: len(result.tokens)]
        else:
            assert result.finish_reason in ("stop", "length"), what
        assert_same_tokens(result.tokens, tokens, gaps, what)
    assert all(aborted_at.values()), (
        f"aborts by state {aborted_at}: these random events no longer abort a request "
        "in every state; change their weights or the seed"
    )
    assert engine.metrics.finished == len(specs)
    assert_engine_empty(engine)


# --- edges of the mixed step ----------------------------------------------------------


@pytest.mark.task(3)
@pytest.mark.parametrize("token_budget", [3, 8, None])
def test_eos_on_a_chunks_last_token_takes_no_slot(
    pair, tokenizer, no_eos, token_budget
):
    """Mixed policy, two slots. B's sampler answers EOS: its last chunk, in a forward
    beside A's decodes, samples EOS, and B finishes with "stop" and no tokens without
    ever holding a slot; D (max_tokens 1) likewise finishes with "length". A and C
    get mlx-lm's tokens."""
    mlx_model, model = pair
    sampler, banned = no_eos
    rng = np.random.default_rng(23)
    vocab = mlx_model.args.vocab_size
    prompts = {name: token_ids(rng, vocab, n) for name, n in zip("ABCD", (6, 10, 5, 3))}
    specs = {
        "A": tiny.PromptSpec(prompts["A"], max_tokens=8),
        "B": tiny.PromptSpec(prompts["B"], sampler=eos_first(tokenizer)),
        "C": tiny.PromptSpec(prompts["C"], max_tokens=3),
        "D": tiny.PromptSpec(prompts["D"], max_tokens=1),
    }
    recorder = Recorder()
    engine = tiny.Engine(
        model,
        tokenizer,
        batch_size=2,
        prefill_step=4,
        policy="mixed",
        token_budget=token_budget,
        max_tokens=20,
        sampler=sampler,
        on_forward=recorder.records.append,
    )
    ids = {name: engine.add_request(spec) for name, spec in specs.items()}
    lengths = {ids[name]: len(prompts[name]) for name in ids}
    held = set()

    def check(engine) -> None:
        assert_caches_follow_slots(engine, recorder, lengths)
        held.update(v.request for v in engine.snapshot().slots if v is not None)

    recorder.run(engine, check)
    check_outputs(recorder, ids.values())
    b = recorder.result(ids["B"])
    assert b.finish_reason == "stop" and b.tokens == [] and b.text == ""
    assert b.metrics.generated_tokens == 1  # the EOS
    assert sum(recorder.chunks(ids["B"])) == len(prompts["B"])
    last_chunk = max(
        n for n, r in enumerate(recorder.records) if ids["B"] in dict(r.chunks)
    )
    assert recorder.records[last_chunk].decodes, "B's last chunk ran beside decodes"
    d = recorder.result(ids["D"])
    assert d.finish_reason == "length" and len(d.tokens) == 1
    for name in "BD":
        assert ids[name] not in held, f"{name} took a slot"
        assert recorder.in_decodes(ids[name]) == [], f"{name} decoded"
    for name in "ACD":
        ((tokens, gaps),) = expected_tokens(
            mlx_model, [prompts[name]], specs[name].max_tokens, tokenizer, banned
        )
        assert_same_tokens(recorder.result(ids[name]).tokens, tokens, gaps, name)
    check_forwards(recorder, ids.values(), lengths, "mixed", token_budget, 4, 2)
    assert_engine_empty(engine)


@pytest.mark.task(3)
@pytest.mark.parametrize("token_budget, prefill_step", [(3, 3), (8, None), (None, 4)])
def test_mixed_policy_stops_at_max_seq_len(
    pair, tokenizer, no_eos, token_budget, prefill_step
):
    """max_seq_len 13. A prompt of 10 tokens: three generated tokens fit the cache and
    a fourth is sampled from its last position. A prompt of 13: its prefill fills the
    cache, so its first token is its last, and it never takes a slot. A prompt of 3:
    eleven tokens."""
    mlx_model, model = pair
    sampler, banned = no_eos
    rng = np.random.default_rng(24)
    prompts = [token_ids(rng, mlx_model.args.vocab_size, n) for n in (10, 13, 3)]
    results = tiny.batch_generate(
        model,
        tokenizer,
        prompts,
        batch_size=2,
        prefill_step=prefill_step,
        max_seq_len=13,
        max_tokens=20,
        sampler=sampler,
        policy="mixed",
        token_budget=token_budget,
    )
    for i, (prompt, result) in enumerate(zip(prompts, results)):
        assert result.finish_reason == "max_seq_len", f"prompt {i}"
        count = 13 - len(prompt) + 1
        ((tokens, gaps),) = expected_tokens(
            mlx_model, [prompt], count, tokenizer, banned
        )
        assert len(tokens) == count
        assert_same_tokens(result.tokens, tokens, gaps, f"prompt {i}")
    # The same on the engine itself: the full prompt never decodes.
    recorder = Recorder()
    engine = tiny.Engine(
        model,
        tokenizer,
        batch_size=2,
        max_seq_len=13,
        prefill_step=prefill_step,
        policy="mixed",
        token_budget=token_budget,
        max_tokens=20,
        sampler=sampler,
        on_forward=recorder.records.append,
    )
    ids = [engine.add_request(p) for p in prompts]
    recorder.run(engine)
    assert recorder.in_decodes(ids[1]) == []
    assert [len(recorder.tokens(i)) for i in ids] == [4, 1, 11]
    assert_engine_empty(engine)


@pytest.mark.task(3)
@pytest.mark.parametrize("policy, token_budget", POLICIES, ids=POLICY_IDS)
def test_metrics_count_the_forwards(pair, tokenizer, no_eos, policy, token_budget):
    """The run's counters against the ForwardRecords and the results: mixed_steps
    counts forwards, decode_steps the forwards with decodes, prefill_chunks and
    prefill_tokens the chunks and their prompt tokens, generated_tokens the tokens."""
    mlx_model, model = pair
    sampler, banned = no_eos
    rng = np.random.default_rng(25)
    prompts = [token_ids(rng, mlx_model.args.vocab_size, n) for n in (17, 4, 9, 1, 12)]
    max_tokens = [3, 6, 1, 4, 5]
    recorder = Recorder()
    engine = tiny.Engine(
        model,
        tokenizer,
        batch_size=2,
        prefill_step=5,
        policy=policy,
        token_budget=token_budget,
        sampler=sampler,
        on_forward=recorder.records.append,
    )
    ids = [
        engine.add_request(tiny.PromptSpec(p, max_tokens=n))
        for p, n in zip(prompts, max_tokens)
    ]
    recorder.run(engine)
    check_outputs(recorder, ids)
    records, metrics = recorder.records, engine.metrics
    results = [recorder.result(i) for i in ids]
    assert [len(r.tokens) for r in results] == max_tokens
    with_decodes = sum(bool(r.decodes) for r in records)
    if policy == "mixed":
        assert metrics.mixed_steps == len(records)
        assert metrics.mixed_seconds == pytest.approx(
            sum(r.end - r.start for r in records)
        )
    else:
        assert metrics.mixed_steps == 0
    assert metrics.decode_steps == with_decodes
    assert metrics.prefill_chunks == sum(len(r.chunks) for r in records)
    assert metrics.prefill_tokens == sum(len(p) for p in prompts)
    assert metrics.generated_tokens == sum(max_tokens)
    assert metrics.finished == len(prompts)
    assert metrics.total_seconds >= sum(r.end - r.start for r in records)
    for request_id, prompt, result in zip(ids, prompts, results):
        assert result.metrics.prompt_tokens == len(prompt)
        assert result.metrics.prefill_chunks == len(recorder.chunks(request_id))
        assert result.metrics.generated_tokens == len(result.tokens)
    lengths = {i: len(p) for i, p in zip(ids, prompts)}
    check_forwards(recorder, ids, lengths, policy, token_budget, 5, 2)
    for (tokens, gaps), result in zip(
        [
            expected_tokens(mlx_model, [p], n, tokenizer, banned)[0]
            for p, n in zip(prompts, max_tokens)
        ],
        results,
    ):
        assert_same_tokens(result.tokens, tokens, gaps, "metrics run")


@pytest.mark.task(3)
def test_mixed_step_fills_its_budget_by_priority_then_arrival(pair, tokenizer, no_eos):
    """Three slots, a budget of 16 tokens, no cap per request; A (40 tokens) and B (20)
    from the start, C (6, interactive) from the third step; 3 tokens each. Decodes
    go first, then chunks, interactive before batch, first come first served:

        forward 1: A 16            forward 2: A 16
        forward 3: C 6, A 8, B 2   (C jumps the queue; A and C end their prompts)
        forward 4: decode C, A + B 14
        forward 5: decode C, A + B 4 (C and A finish)
        forward 6, 7: decode B
    """
    mlx_model, model = pair
    sampler, banned = no_eos
    rng = np.random.default_rng(26)
    vocab = mlx_model.args.vocab_size
    prompts = {name: token_ids(rng, vocab, n) for name, n in zip("ABC", (40, 20, 6))}
    recorder = Recorder()
    engine = tiny.Engine(
        model,
        tokenizer,
        batch_size=3,
        prefill_step=None,
        policy="mixed",
        token_budget=16,
        max_tokens=3,
        sampler=sampler,
        on_forward=recorder.records.append,
    )
    a = engine.add_request(prompts["A"])
    b = engine.add_request(prompts["B"])
    c = engine.add_request(
        tiny.PromptSpec(prompts["C"], priority="interactive", arrival_step=2)
    )
    recorder.run(engine)
    schedule = [(dict(r.chunks), set(r.decodes)) for r in recorder.records]
    assert schedule == [
        ({a: 16}, set()),
        ({a: 16}, set()),
        ({c: 6, a: 8, b: 2}, set()),
        ({b: 14}, {a, c}),
        ({b: 4}, {a, c}),
        ({}, {b}),
        ({}, {b}),
    ]
    for name, request_id in zip("ABC", (a, b, c)):
        ((tokens, gaps),) = expected_tokens(
            mlx_model, [prompts[name]], 3, tokenizer, banned
        )
        assert_same_tokens(recorder.result(request_id).tokens, tokens, gaps, name)


# --- bad input --------------------------------------------------------------------


@pytest.mark.task(3)
@pytest.mark.parametrize(
    "settings, name",
    [
        (dict(policy="other"), "policy"),
        (dict(policy="Mixed"), "policy"),
        (dict(policy="mixed", token_budget=3), "token_budget"),
        (dict(policy="mixed", token_budget=1), "token_budget"),
        (dict(policy="mixed", token_budget=0), "token_budget"),
        (dict(policy="mixed", token_budget=-8), "token_budget"),
        (dict(policy="alternate", token_budget=16), "token_budget"),
        (dict(token_budget=16), "token_budget"),
    ],
)
def test_engine_rejects_bad_policy_settings(pair, tokenizer, settings, name):
    """batch_size 3: a budget must leave room for a prefill token beside three
    decodes (at least 4), and only the mixed policy has one."""
    _, model = pair
    with pytest.raises(ValueError, match=name):
        tiny.Engine(model, tokenizer, batch_size=3, **settings)
    with pytest.raises(ValueError, match=name):
        tiny.batch_generate(model, tokenizer, [[1, 2, 3]], batch_size=3, **settings)


@pytest.mark.task(3)
@pytest.mark.parametrize("token_budget", ["16", 16.0, True])
def test_engine_rejects_a_token_budget_that_is_not_an_int(
    pair, tokenizer, token_budget
):
    _, model = pair
    with pytest.raises(TypeError, match="token_budget"):
        tiny.Engine(model, tokenizer, policy="mixed", token_budget=token_budget)


@pytest.mark.task(3)
def test_the_smallest_budget_is_accepted(pair, tokenizer):
    _, model = pair
    engine = tiny.Engine(model, tokenizer, batch_size=3, policy="mixed", token_budget=4)
    assert not engine.has_unfinished() and engine.step() == []


@pytest.mark.task(3)
def test_mixed_chunks_give_prompt_and_answer_logprobs(pair, tokenizer, no_eos):
    """A request that wants its prompt's logprobs gets every row of each of its
    chunks, in steps shared with another request's decodes: each prompt token's
    logprob and each answer token's are mlx-lm's, from one forward over the
    whole sequence."""
    mlx_model, model = pair
    sampler, _ = no_eos
    rng = np.random.default_rng(8)
    first, scored = (token_ids(rng, mlx_model.args.vocab_size, n) for n in (6, 17))
    options = tiny.SamplingOptions(prompt_logprobs=2, logprobs=2)
    results = tiny.batch_generate(
        model,
        tokenizer,
        [tiny.PromptSpec(first, 12), tiny.PromptSpec(scored, 4, options=options)],
        policy="mixed",
        prefill_step=5,
        token_budget=7,
        sampler=sampler,
    )
    result = results[1]
    assert result.metrics.prefill_chunks >= 4
    assert_prompt_logprobs(result.prompt_logprobs, scored, mlx_model, 2)
    expected = mlx_lm_logprobs(mlx_model, scored + result.tokens)
    for i, entry in enumerate(result.logprobs):
        assert_token_logprob(entry, result.tokens[i], expected[len(scored) - 1 + i], 2)


@pytest.mark.task(3)
def test_a_failed_mixed_forward_fails_its_requests_and_the_engine_goes_on(
    pair, tokenizer, no_eos, monkeypatch
):
    """Budget 5, chunks of 4: A (5 tokens) decodes while B (18) prefills and C (9)
    waits behind B. The forward that fails (in its second layer, after the first
    wrote its caches) fails A and B, and frees A's slot and every cache row; C, and D
    added after, get mlx-lm's tokens, D in the slot A held."""
    mlx_model, model = pair
    sampler, banned = no_eos
    rng = np.random.default_rng(27)
    vocab = mlx_model.args.vocab_size
    prompts = {name: token_ids(rng, vocab, n) for name, n in zip("ABCD", (5, 18, 9, 6))}
    recorder = Recorder()
    engine = tiny.Engine(
        model,
        tokenizer,
        batch_size=3,
        prefill_step=4,
        policy="mixed",
        token_budget=5,
        max_tokens=6,
        sampler=sampler,
        on_forward=recorder.records.append,
    )
    ids, lengths = {}, {}

    def add(name: str) -> None:
        ids[name] = engine.add_request(prompts[name])
        lengths[ids[name]] = len(prompts[name])

    for name in "ABC":
        add(name)
    for _ in range(100):
        if len(recorder.tokens(ids["A"])) >= 2 and recorder.chunks(ids["B"]):
            break
        recorder.step(engine)
    assert sum(recorder.chunks(ids["B"])) < len(prompts["B"]), "B is mid-prefill"
    assert not recorder.chunks(ids["C"]), "C waits behind B"
    slots = [None if v is None else v.request for v in engine.snapshot().slots]
    a_slot = slots.index(ids["A"])
    a_tokens = recorder.tokens(ids["A"])
    failures = []
    second_layer = model.layers[1]

    def fail_once(*args, forward=second_layer.forward):
        if not failures:
            failures.append(True)
            raise RuntimeError("injected failure")
        return forward(*args)

    monkeypatch.setattr(second_layer, "forward", fail_once)
    outputs = {o.request_id: o for o in recorder.step(engine)}
    assert failures, "the step ran no forward"
    for name in "AB":
        output = outputs[ids[name]]
        assert output.finish_reason == "error", name
        assert "injected failure" in output.result.error, name
    assert outputs[ids["A"]].result.tokens == a_tokens
    assert ids["C"] not in outputs
    assert_caches_follow_slots(engine, recorder, lengths)
    assert engine.slots == (None,) * 3
    add("D")
    holders = set()

    def check(engine) -> None:
        assert_caches_follow_slots(engine, recorder, lengths)
        view = engine.snapshot().slots[a_slot]
        holders.add(None if view is None else view.request)

    recorder.run(engine, check)
    assert holders & {ids["C"], ids["D"]}, f"nobody took slot {a_slot} after A"
    check_outputs(recorder, ids.values())
    for name in "CD":
        ((tokens, gaps),) = expected_tokens(
            mlx_model, [prompts[name]], 6, tokenizer, banned
        )
        result = recorder.result(ids[name])
        assert result.finish_reason == "length"
        assert_same_tokens(result.tokens, tokens, gaps, name)
    ((tokens, gaps),) = expected_tokens(mlx_model, [prompts["A"]], 6, tokenizer, banned)
    assert_same_tokens(a_tokens, tokens[: len(a_tokens)], gaps, "A before the failure")
    assert_engine_empty(engine)
