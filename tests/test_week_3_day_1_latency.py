"""Week 3 Day 1: who shares a mixed step (mixed_policy.py).

A long prompt's chunks are capped at long_prefill_token_threshold, and by their
attention scores at long_prefill_attention_budget, alone or beside others; at most
max_num_partial_prefills requests are partly prefilled at once, at most
max_long_partial_prefills of them long; a short prompt gets through while a long one
is in progress, in a step without the started long prompt's chunk, and takes the
slot a started long prompt would have kept in view (the long one pauses); an
interactive request with no free slot preempts a decoding
batch request that arrived less than batch_patience before it (a long one then
keeps that slot from the batch request), and the preempted request still finishes
with the tokens it gets alone.
Tokens are compared with mlx-lm generating each prompt alone on the same weights.
"""

import numpy as np
import pytest

from tiny_llm_base import EngineConfig
from tiny_llm_base.mlx_lm_reference import greedy_without

from .helpers import assert_same_tokens, expected_tokens, run_engine, token_ids
from .solution import tiny

LONG, SHORT = 40, 5


def assert_tokens(results, mlx_model, specs, tokenizer, banned):
    for i, (spec, result) in enumerate(zip(specs, results)):
        assert result.error is None, result.error
        [(tokens, gaps)] = expected_tokens(
            mlx_model, [spec.prompt], spec.max_tokens, tokenizer, banned
        )
        assert_same_tokens(result.tokens, tokens, gaps, f"prompt {i}")


def specs_of(rng, vocab, lengths, max_tokens=3, **fields):
    return [
        tiny.PromptSpec(token_ids(rng, vocab, n), max_tokens=max_tokens, **fields)
        for n in lengths
    ]


def chunks_by_request(forwards) -> dict[int, list[int]]:
    """Each request id's prefill chunk sizes, in the order the forwards ran them."""
    chunks = {}
    for forward in forwards:
        for request_id, tokens in forward.chunks:
            chunks.setdefault(request_id, []).append(tokens)
    return chunks


@pytest.mark.task(3)
def test_a_long_prompts_chunks_are_capped_at_the_threshold(pair, tokenizer, no_eos):
    mlx_model, model = pair
    sampler, banned = no_eos
    rng = np.random.default_rng(11)
    specs = specs_of(rng, mlx_model.args.vocab_size, (LONG, SHORT, 9))
    forwards = []
    engine = tiny.Engine(
        model,
        tokenizer,
        batch_size=3,
        prefill_step=None,
        policy="mixed",
        long_prefill_token_threshold=8,
        sampler=sampler,
        on_forward=forwards.append,
    )
    results = run_engine(engine, specs)
    chunks = chunks_by_request(forwards)
    assert chunks[0] == [8] * 5  # 40 tokens, long: five chunks of 8
    assert chunks[1] == [SHORT] and chunks[2] == [8, 1]  # 9 > 8: long too
    assert_tokens(results, mlx_model, specs, tokenizer, banned)


def budgeted_chunks(prompt: int, threshold: int, budget: int) -> list[int]:
    """The chunks the budget rule gives a long prompt of `prompt` tokens, by search:
    from the threshold (or the tokens left) down to 1, the first size whose scores
    against every position up to its end fit."""
    chunks, offset = [], 0
    while offset < prompt:
        size = min(threshold, prompt - offset)
        size = next(
            n for n in range(size, 0, -1) if n * (offset + n) <= budget or n == 1
        )
        chunks.append(size)
        offset += size
    return chunks


@pytest.mark.task(3)
@pytest.mark.parametrize("budget", [200, 1])
def test_a_long_prompts_chunks_shrink_within_the_attention_budget(
    pair, tokenizer, no_eos, budget
):
    """A 40-token prompt, threshold 16: its chunks are cut where L x (offset + L)
    would pass the budget (200: 14, 8, 6, 5, 5, 2), never below one token (budget
    1); the short prompt beside it is not long and is not cut, and decodes through
    every step of the long one, so the long one is never alone."""
    mlx_model, model = pair
    sampler, banned = no_eos
    rng = np.random.default_rng(14)
    vocab = mlx_model.args.vocab_size
    specs = specs_of(rng, vocab, (LONG,)) + specs_of(rng, vocab, (12,), LONG + 1)
    forwards = []
    engine = tiny.Engine(
        model,
        tokenizer,
        batch_size=2,
        prefill_step=None,
        policy="mixed",
        long_prefill_token_threshold=16,
        long_prefill_attention_budget=budget,
        sampler=sampler,
        on_forward=forwards.append,
    )
    results = run_engine(engine, specs)
    chunks = chunks_by_request(forwards)
    expected = budgeted_chunks(LONG, 16, budget)
    assert chunks[0] == expected
    assert expected == ([14, 8, 6, 5, 5, 2] if budget == 200 else [1] * LONG)
    assert chunks[1] == [12]  # 12 <= 16: not long, 144 scores or not
    assert_tokens(results, mlx_model, specs, tokenizer, banned)


@pytest.mark.task(3)
def test_a_long_prompt_alone_is_cut_by_the_attention_budget_too(
    pair, tokenizer, no_eos
):
    """A request that arrives waits for the step in flight, whoever is in it: a
    40-token prompt with nothing beside it runs in the same chunks under a
    threshold of 16 and a budget of 200 as beside a decoding request (14, 8, 6, 5,
    5, 2)."""
    mlx_model, model = pair
    sampler, banned = no_eos
    rng = np.random.default_rng(16)
    specs = specs_of(rng, mlx_model.args.vocab_size, (LONG,))
    forwards = []
    engine = tiny.Engine(
        model,
        tokenizer,
        prefill_step=None,
        policy="mixed",
        long_prefill_token_threshold=16,
        long_prefill_attention_budget=200,
        sampler=sampler,
        on_forward=forwards.append,
    )
    results = run_engine(engine, specs)
    assert chunks_by_request(forwards)[0] == budgeted_chunks(LONG, 16, 200)
    assert_tokens(results, mlx_model, specs, tokenizer, banned)


@pytest.mark.task(3)
@pytest.mark.parametrize("most, most_long", [(1, None), (2, 1), (3, 2), (None, 1)])
def test_partial_prefills_stay_within_the_limits(
    pair, tokenizer, no_eos, most, most_long
):
    mlx_model, model = pair
    sampler, banned = no_eos
    rng = np.random.default_rng(12)
    lengths = (LONG, 30, SHORT, 25, 6, 7, 33)
    specs = specs_of(rng, mlx_model.args.vocab_size, lengths)
    engine = tiny.Engine(
        model,
        tokenizer,
        batch_size=7,
        prefill_step=4,
        policy="mixed",
        long_prefill_token_threshold=20,
        max_num_partial_prefills=most,
        max_long_partial_prefills=most_long,
        sampler=sampler,
    )
    seen = []

    def check_limits(engine):
        partial = [r for r in engine.waiting if 0 < r.offset < len(r.prefill_tokens)]
        long_ones = [r for r in partial if len(r.prefill_tokens) > 20]
        seen.append((len(partial), len(long_ones)))
        assert most is None or len(partial) <= most
        assert most_long is None or len(long_ones) <= most_long

    results = run_engine(engine, specs, check_limits)
    assert_tokens(results, mlx_model, specs, tokenizer, banned)
    # The limits were reached, so the checks above tested something.
    assert max(n for n, _ in seen) == (most or max(n for n, _ in seen))
    assert most_long is None or max(n for _, n in seen) == most_long


def first_token_steps(model, tokenizer, sampler, specs, **settings) -> list[int]:
    """The step (1, 2, ...) in which each request got its first token."""
    engine = tiny.Engine(model, tokenizer, sampler=sampler, **settings)
    ids = [engine.add_request(spec) for spec in specs]
    first = {}
    while engine.has_unfinished():
        for output in engine.step():
            if output.tokens:
                first.setdefault(output.request_id, engine.steps_done)
    return [first[i] for i in ids]


@pytest.mark.task(3)
def test_a_short_prompt_gets_through_while_a_long_one_prefills(pair, tokenizer, no_eos):
    """The long prompt arrives first and needs 5 steps of 8-token chunks; the short
    one arrives in step 3. With room for two partial prefills it answers in the step
    it arrives, a step the started long prompt sits out (it yields the step), so the
    long one answers in step 6; one at a time (first come, first served), the short
    one waits for the long one."""
    mlx_model, model = pair
    sampler, _ = no_eos
    rng = np.random.default_rng(13)
    long_prompt, short_prompt = (
        token_ids(rng, mlx_model.args.vocab_size, n) for n in (LONG, SHORT)
    )
    specs = [
        tiny.PromptSpec(long_prompt, max_tokens=2),
        tiny.PromptSpec(short_prompt, max_tokens=2, arrival_step=2),
    ]
    settings = dict(batch_size=2, prefill_step=None, policy="mixed")
    settings["long_prefill_token_threshold"] = 8
    forwards = []
    long_first, short_first = first_token_steps(
        model,
        tokenizer,
        sampler,
        specs,
        max_num_partial_prefills=2,
        on_forward=forwards.append,
        **settings,
    )
    assert (long_first, short_first) == (6, 3)
    assert [f.chunks for f in forwards[:6]] == [
        [(0, 8)],
        [(0, 8)],
        [(1, SHORT)],
        [(0, 8)],
        [(0, 8)],
        [(0, 8)],
    ]
    long_first, short_first = first_token_steps(
        model, tokenizer, sampler, specs, max_num_partial_prefills=1, **settings
    )
    assert (long_first, short_first) == (5, 6)


@pytest.mark.task(4)
def test_a_long_prompt_yields_its_slot_to_a_short_one(pair, tokenizer, no_eos):
    """Two slots: a short prompt decoding 6 tokens holds one, a long prompt (5 chunks
    of 8) prefills toward the other, and a second short prompt arrives in step 3. The
    long one yields: the short one takes the free slot and answers in step 3, the long
    one pauses while both slots are taken (steps 3 and 4) and answers in step 7.
    Had the long one kept the slot in view, it would answer in step 5 and the short
    one would wait for a slot until step 7."""
    mlx_model, model = pair
    sampler, banned = no_eos
    rng = np.random.default_rng(15)
    vocab = mlx_model.args.vocab_size
    first, long_prompt, second = (token_ids(rng, vocab, n) for n in (SHORT, LONG, 6))
    specs = [
        tiny.PromptSpec(first, max_tokens=6),
        tiny.PromptSpec(long_prompt, max_tokens=2),
        tiny.PromptSpec(second, max_tokens=2, arrival_step=2),
    ]
    settings = dict(batch_size=2, prefill_step=None, policy="mixed")
    steps = first_token_steps(
        model, tokenizer, sampler, specs, long_prefill_token_threshold=8, **settings
    )
    assert steps == [1, 7, 3]
    engine = tiny.Engine(
        model, tokenizer, sampler=sampler, long_prefill_token_threshold=8, **settings
    )
    assert_tokens(run_engine(engine, specs), mlx_model, specs, tokenizer, banned)


def batch_then_interactive(vocab: int) -> list:
    """Two batch requests of 12 tokens, then an interactive one arriving in step 5."""
    rng = np.random.default_rng(14)
    specs = specs_of(rng, vocab, (7, 9), max_tokens=12, priority="batch")
    interactive = token_ids(rng, vocab, 6)
    return specs + [
        tiny.PromptSpec(
            interactive, max_tokens=3, priority="interactive", arrival_step=4
        )
    ]


@pytest.mark.task(4)
def test_an_interactive_request_preempts_batch_work(pair, tokenizer, no_eos):
    """Both slots decode batch requests when an interactive one arrives: it preempts
    the newest and answers in its first step; the preempted request recomputes and
    still gets mlx-lm's tokens."""
    mlx_model, model = pair
    sampler, banned = no_eos
    specs = batch_then_interactive(mlx_model.args.vocab_size)
    settings = dict(batch_size=2, prefill_step=None, policy="mixed")
    engine = tiny.Engine(model, tokenizer, sampler=sampler, **settings)
    results = run_engine(engine, specs)
    assert_tokens(results, mlx_model, specs, tokenizer, banned)
    assert engine.metrics.preemptions == 1
    assert [r.metrics.preemptions for r in results] == [0, 1, 0]
    steps = first_token_steps(model, tokenizer, sampler, specs, **settings)
    assert steps[2] == 5  # arrived at the start of step 5, answered in it


@pytest.mark.task(4)
def test_a_long_interactive_prompt_keeps_its_slot_from_batch_work(
    pair, tokenizer, no_eos
):
    """As above with a 40-token interactive prompt, long under a threshold of 8: it
    preempts a batch request in step 5 and runs its five chunks in steps 5 to 9. The
    preempted batch request, short and waiting, does not take the slot back: a
    started long prompt yields to interactive requests only."""
    mlx_model, model = pair
    sampler, banned = no_eos
    vocab = mlx_model.args.vocab_size
    specs = batch_then_interactive(vocab)
    long_prompt = token_ids(np.random.default_rng(17), vocab, LONG)
    specs[2] = tiny.PromptSpec(
        long_prompt, max_tokens=3, priority="interactive", arrival_step=4
    )
    settings = dict(batch_size=2, prefill_step=None, policy="mixed")
    settings["long_prefill_token_threshold"] = 8
    forwards = []
    engine = tiny.Engine(
        model, tokenizer, sampler=sampler, on_forward=forwards.append, **settings
    )
    results = run_engine(engine, specs)
    assert_tokens(results, mlx_model, specs, tokenizer, banned)
    assert [r.metrics.preemptions for r in results] == [0, 1, 0]
    steps = [i for i, f in enumerate(forwards, 1) if any(c[0] == 2 for c in f.chunks)]
    assert steps == [5, 6, 7, 8, 9]


@pytest.mark.task(3)
@pytest.mark.parametrize("newer_in_slot_0", [False, True])
def test_on_a_deadline_tie_the_lowest_slot_is_preempted(
    pair, tokenizer, no_eos, newer_in_slot_0
):
    """Two decoding batch requests of the same deadline fill both slots when an
    interactive request waits: preempt_for_interactive preempts the one in the
    lowest slot (whichever was added first), and only it."""
    _, model = pair
    config = EngineConfig(batch_size=2, max_seq_len=64, policy="mixed")
    planner = tiny.Planner(config, tiny.DenseKvManager(model, config))
    policy = tiny.MixedPolicy(planner)
    older, newer, interactive = (
        tiny.Request(
            model, tokenizer, list(range(10, 10 + n)), sampler=no_eos[0], priority=p
        )
        for n, p in ((5, "batch"), (6, "batch"), (4, "interactive"))
    )
    for request in (older, newer, interactive):
        request.metrics.arrival = 0.0  # the batch requests' deadlines tie
    planner.add(older)
    planner.add(newer)
    for request in (newer, older) if newer_in_slot_0 else (older, newer):
        planner.admit(request)
        request.try_prefill()
        planner.place_prefilled()  # the lowest free slot
    lowest, highest = planner.slots
    assert {lowest, highest} == {older, newer}
    assert (lowest is newer) == newer_in_slot_0
    planner.add(interactive)
    policy.preempt_for_interactive([])
    assert planner.slots == [None, highest], "the lowest slot's request is preempted"
    assert lowest.metrics.preemptions == 1 and highest.metrics.preemptions == 0
    assert policy.preemptions == 1 and planner.waiting[0] is lowest


@pytest.mark.task(4)
def test_no_preemption_past_batch_patience(pair, tokenizer, no_eos):
    """With batch_patience 0 the batch requests keep their slots: the interactive
    request waits for one to finish, and nothing is preempted."""
    mlx_model, model = pair
    sampler, banned = no_eos
    specs = batch_then_interactive(mlx_model.args.vocab_size)
    settings = dict(batch_size=2, prefill_step=None, policy="mixed", batch_patience=0)
    engine = tiny.Engine(model, tokenizer, sampler=sampler, **settings)
    results = run_engine(engine, specs)
    assert_tokens(results, mlx_model, specs, tokenizer, banned)
    assert engine.metrics.preemptions == 0
    steps = first_token_steps(model, tokenizer, sampler, specs, **settings)
    assert steps[2] > max(steps[:2]) + 10  # after a batch request's 12 tokens


@pytest.mark.task(4)
def test_preempted_batch_requests_finish_with_their_tokens_on_the_embedded_model(
    embedded_model, embedded_week2_model, embedded_float32_reference
):
    """The embedded model, float32, dense (day 1 needs no later day): four batch
    requests decoding in four slots, two interactive ones arriving; every request's
    tokens equal mlx-lm's alone."""
    mlx_model, tokenizer = embedded_model
    model = embedded_week2_model(True)
    texts = ["Name a planet.", "What is 2 + 2?", "Say hi.", "Count to five."]
    specs = [
        tiny.PromptSpec(tokenizer.encode(t), max_tokens=10, priority="batch")
        for t in texts
    ]
    specs += [
        tiny.PromptSpec(
            tokenizer.encode(t), max_tokens=6, priority="interactive", arrival_step=s
        )
        for t, s in (("What colour is the sky?", 3), ("Name a fruit.", 5))
    ]
    banned = sorted(tokenizer.eos_token_ids)
    engine = tiny.Engine(
        model,
        tokenizer,
        batch_size=4,
        max_seq_len=64,
        policy="mixed",
        kv_cache="dense",  # day 1 alone: the paged cache is days 2 and 3
        sampler=greedy_without(banned, mlx_model.args.vocab_size),
    )
    results = run_engine(engine, specs)
    assert engine.metrics.preemptions == 2
    for i, (spec, result) in enumerate(zip(specs, results)):
        [(tokens, gaps)] = expected_tokens(
            embedded_float32_reference,
            [spec.prompt],
            spec.max_tokens,
            tokenizer,
            banned,
        )
        assert_same_tokens(result.tokens, tokens, gaps, f"prompt {i}")


@pytest.mark.task(3)
@pytest.mark.parametrize(
    "settings, error",
    [
        (dict(max_num_partial_prefills=2), ValueError),
        (dict(long_prefill_token_threshold=64), ValueError),
        (dict(policy="mixed", max_num_partial_prefills=0), ValueError),
        (dict(policy="mixed", long_prefill_token_threshold=2.5), TypeError),
        (dict(long_prefill_attention_budget=4096), ValueError),
        (
            dict(
                policy="mixed",
                long_prefill_token_threshold=64,
                long_prefill_attention_budget=0,
            ),
            ValueError,
        ),
        (dict(policy="mixed", long_prefill_attention_budget=4096), ValueError),
        (
            dict(
                policy="mixed", max_num_partial_prefills=2, max_long_partial_prefills=3
            ),
            ValueError,
        ),
        (dict(batch_patience=-1), ValueError),
        (dict(batch_patience=float("nan")), ValueError),
        (dict(batch_patience="soon"), TypeError),
    ],
)
def test_bad_limits_are_refused_with_the_setting_named(settings, error):
    with pytest.raises(error) as raised:
        EngineConfig(**settings)
    assert any(name in str(raised.value) for name in settings if name != "policy")
