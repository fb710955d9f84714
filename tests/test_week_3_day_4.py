"""Week 3 Day 4: speculative decoding.

Prompt lookup against a brute-force search; the shut-off rule against the throughput
it stands for; the acceptance rule: greedy keeps what step-by-step argmax keeps, and
sampled tokens follow the sampler's exact distribution (chi-square against the
distribution computed from the logits); the engine with speculation gives mlx-lm's
greedy tokens and the same tokens as without, for random Qwen2/Llama models and the
embedded model, batch sizes 1-5, both caches, prefix caching on, k in {1, 2, 4, 8};
after every step each decoding row holds exactly its request's accepted tokens (keys
equal to a fresh prefill's, no block past them), and the pool's rules hold.
"""

import math
from types import SimpleNamespace

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tiny_llm_base import (
    EngineConfig,
    PlainSampling,
    PromptSpec,
    SamplingOptions,
    greedy,
    prompt_token_ids,
    start_sampling,
)

from .helpers import (
    assert_same_tokens,
    expected_tokens,
    run_engine,
    sharpened,
)
from .paged_checks import check_pool
from .random_models import SIZES, random_model
from .solution import tiny
from .speculation_checks import (
    CHI_SQUARE_999,
    third_token_counts,
    third_token_distribution,
    check_rows,
    chi_square,
    engine_tokens,
    repeating_prompt,
)


def brute_force_drafts(tokens, k, max_n, min_n):
    """For n from max_n down to min_n: the latest earlier occurrence of the last n
    tokens (ending before the last position), and the k tokens after it."""
    for n in range(max_n, min_n - 1, -1):
        if n >= len(tokens):
            continue
        suffix = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start : start + n] == suffix:
                return tokens[start + n : start + n + k]
    return []


# --- drafts -------------------------------------------------------------------------


@pytest.mark.task(1)
@settings(max_examples=300, deadline=None)
@given(
    tokens=st.lists(st.integers(0, 4), min_size=1, max_size=40),
    k=st.integers(1, 8),
    max_n=st.integers(1, 5),
    shrink=st.integers(0, 4),
)
def test_find_drafts_equals_a_brute_force_search(tokens, k, max_n, shrink):
    min_n = max(1, max_n - shrink)
    assert tiny.find_drafts(tokens, k, max_n, min_n) == brute_force_drafts(
        tokens, k, max_n, min_n
    )


@pytest.mark.task(1)
def test_find_drafts_prefers_the_longest_then_the_latest_match():
    tokens = [7, 1, 2, 3, 9, 2, 3, 8, 5, 1, 2, 3]
    # 1 2 3 occurs at 1..3 (followed by 9); 2 3 alone later at 5..6 (followed by 8).
    assert tiny.find_drafts(tokens, 3, 3, 1) == [9, 2, 3]
    assert tiny.find_drafts(tokens, 3, 2, 1) == [8, 5, 1]
    assert tiny.find_drafts([1, 2, 3, 4], 3, 3, 1) == []
    assert tiny.find_drafts([5, 6, 5], 4, 3, 2) == []
    assert tiny.find_drafts([5, 6, 5], 4, 3, 1) == [6, 5]


@pytest.mark.task(1)
@pytest.mark.parametrize("rows", [1, 2, 4, 8])
def test_worth_drafting_is_the_throughput_comparison(rows):
    """Drafts pay exactly when tokens per forward-time rise with them, and at
    break_even they neither gain nor lose."""
    cost = tiny.speculative.DRAFT_TOKEN_COST
    plain = rows / (1 + cost * (rows - 1))
    k = 4

    def drafting(acceptance):
        return (rows + acceptance * k) / (1 + cost * (rows - 1) + cost * k)

    assert math.isclose(drafting(tiny.break_even(rows)), plain)
    assert tiny.worth_drafting(tiny.break_even(rows), rows)
    for acceptance in np.linspace(0, 1, 41):
        if not math.isclose(drafting(acceptance), plain):
            assert tiny.worth_drafting(acceptance, rows) == (
                drafting(acceptance) > plain
            )


def drafting_request(sampler=greedy):
    """The fields may_draft reads, on a request that has generated 20 tokens."""
    return SimpleNamespace(
        sampler=sampler,
        next_token=7,
        constraint_state=None,
        sampling_state=PlainSampling(),
        generated=[1] * 20,
        drafting=tiny.DraftState(),
    )


def drafting_request_with(options):
    """drafting_request, carrying the state its sampling options start."""
    request = drafting_request()
    request.sampling_state = start_sampling(options, [1, 2], greedy, {0}, 211)
    return request


@pytest.mark.task(1)
def test_a_request_whose_drafts_fail_pauses_longer_each_time():
    """Below break-even a request pauses RETRY_AFTER tokens, then twice as long each
    time; after a pause it probes once from break-even."""
    request, rows = drafting_request(), 4
    retry = tiny.speculative.RETRY_AFTER
    assert tiny.may_draft(request, rows)
    drafting = request.drafting
    drafting.acceptance = 0.9 * tiny.break_even(rows)
    for pauses in range(3):
        assert not tiny.may_draft(request, rows)
        pause = retry * 2**pauses
        assert drafting.resume_at == len(request.generated) + pause
        assert drafting.pauses == pauses + 1
        request.generated += [1] * (pause - 1)
        assert not tiny.may_draft(request, rows), "drafted before its pause ended"
        request.generated.append(1)
        assert tiny.may_draft(request, rows), "no probe once the pause ended"
        drafting.acceptance -= 0.01  # the probe was rejected
    drafting.acceptance = 0.9  # above break-even at 4 rows for any cost below 0.8
    assert tiny.may_draft(request, rows)


@pytest.mark.task(1)
def test_a_request_decoding_alone_pays_the_cheaper_cost():
    """Alone (rows 1) a request's drafts cost DRAFT_TOKEN_COST_ALONE, beside other
    rows DRAFT_TOKEN_COST: an acceptance between the two break-evens keeps it
    drafting alone and pauses it beside one other row."""
    speculative = tiny.speculative
    alone = tiny.break_even(1, speculative.DRAFT_TOKEN_COST_ALONE)
    assert alone < tiny.break_even(1, speculative.DRAFT_TOKEN_COST)
    between = (alone + tiny.break_even(1, speculative.DRAFT_TOKEN_COST)) / 2
    request = drafting_request()
    request.drafting.acceptance = between
    assert tiny.may_draft(request, 1)
    assert not tiny.may_draft(request, 2)
    assert math.isclose(
        request.drafting.acceptance,
        tiny.break_even(2, speculative.DRAFT_TOKEN_COST),
    )
    request = drafting_request()
    request.drafting.acceptance = 0.9 * alone
    assert not tiny.may_draft(request, 1)
    assert math.isclose(request.drafting.acceptance, alone)


@pytest.mark.task(1)
def test_only_verifiable_requests_with_a_next_token_draft():
    assert not tiny.may_draft(drafting_request(sampler=lambda logprobs: 0), 1)
    request = drafting_request()
    request.next_token = None
    assert not tiny.may_draft(request, 1)


# --- the acceptance rule ------------------------------------------------------------


def step_by_step_greedy(drafts, logprobs):
    best = np.array(mx.argmax(logprobs, axis=-1)).tolist()
    tokens = []
    for row, token in enumerate(best):
        tokens.append(token)
        if row == len(drafts) or drafts[row] != token:
            break
    return tokens


@pytest.mark.task(2)
@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_greedy_verification_keeps_what_argmax_keeps(data):
    k = data.draw(st.integers(1, 8))
    V = 7
    seed = data.draw(st.integers(0, 10_000))
    logits = mx.random.normal((k + 1, V), key=mx.random.key(seed))
    best = np.array(mx.argmax(logits, axis=-1)).tolist()
    # Drafts that follow the argmax for a while, then may not.
    agree = data.draw(st.integers(0, k))
    drafts = best[:agree] + data.draw(
        st.lists(st.integers(0, V - 1), min_size=k - agree, max_size=k - agree)
    )
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    for sampler in (greedy, tiny.make_sampler(0.0)):
        assert tiny.verified_tokens(sampler, drafts, logprobs) == step_by_step_greedy(
            drafts, logprobs
        )


@pytest.mark.task(2)
@pytest.mark.parametrize(
    "temp, top_p, top_k",
    [(1.0, 1.0, None), (0.7, 0.9, None), (1.3, 1.0, 4)],
    ids=["plain", "top-p", "top-k"],
)
def test_sampled_verification_follows_the_samplers_distribution(temp, top_p, top_k):
    """Row 0's token is drawn from p_0 whatever the draft; given that it kept the
    draft, the next token is drawn from p_1. Each against the distribution the
    sampler itself computes, by chi-square. (Accepting a draft always, or drawing
    a rejection's token from p_j instead of p_j without the draft, fails.)"""
    sampler = tiny.make_sampler(temp, top_p, top_k)
    V = 6
    logits = mx.random.normal((3, V), key=mx.random.key(7)) * 1.5
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    probs = np.array(mx.softmax(sampler.logits(logprobs), axis=-1), dtype=np.float64)
    draft_0 = int(np.argsort(probs[0])[-2])  # a likely draft, not the likeliest
    drafts = [draft_0, int(np.argmax(probs[1]))]
    mx.random.seed(3)
    first, second = np.zeros(V), np.zeros(V)
    for _ in range(3000):
        tokens = tiny.verified_tokens(sampler, drafts, logprobs)
        assert 1 <= len(tokens) <= 3
        first[tokens[0]] += 1
        if tokens[0] == draft_0:
            assert len(tokens) >= 2
            second[tokens[1]] += 1
    for counts, p in ((first, probs[0]), (second, probs[1])):
        statistic, freedom = chi_square(counts, p)
        assert statistic < CHI_SQUARE_999[freedom], (counts, p * counts.sum())


# --- the engine ---------------------------------------------------------------------


@pytest.mark.task(3)
@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_greedy_tokens_equal_plain_decoding_and_mlx_lm(data, random_pairs, tokenizer):
    index = data.draw(st.integers(0, len(SIZES) - 1), label="model")
    mlx_model, model = random_pairs[index]
    vocab = mlx_model.args.vocab_size
    rng = np.random.default_rng(data.draw(st.integers(0, 1000), label="seed"))
    count = data.draw(st.integers(1, 5), label="prompts")
    prompts = [
        repeating_prompt(rng, vocab, int(rng.integers(6, 40)))
        if data.draw(st.booleans(), label="repeats")
        else [int(t) for t in rng.integers(0, vocab, int(rng.integers(1, 30)))]
        for _ in range(count)
    ]
    settings = dict(
        batch_size=data.draw(st.integers(1, 5), label="batch"),
        kv_cache=data.draw(st.sampled_from(["dense", "paged"]), label="kv"),
        block_size=data.draw(st.sampled_from([2, 4, 16]), label="block"),
        max_tokens=20,
        max_seq_len=128,
        step_ahead=data.draw(st.booleans(), label="step_ahead"),
    )
    k = data.draw(st.sampled_from([1, 2, 4, 8]), label="k")

    def check(engine):
        check_rows(engine)
        if engine.config.kv_cache == "paged":
            check_pool(engine)

    plain, _, _ = engine_tokens(model, tokenizer, prompts, **settings)
    speculated, results, metrics = engine_tokens(
        model,
        tokenizer,
        prompts,
        check,
        speculative="ngram",
        num_speculative_tokens=k,
        **settings,
    )
    assert speculated == plain
    assert all(r.finish_reason in ("stop", "length") for r in results)
    assert metrics.accepted_draft_tokens <= metrics.draft_tokens
    assert metrics.draft_tokens <= k * metrics.drafts
    for (tokens, gaps), ours in zip(
        expected_tokens(mlx_model, prompts, 20, tokenizer), speculated
    ):
        assert_same_tokens(ours, tokens, gaps, "speculated vs mlx-lm")


@pytest.mark.task(3)
@pytest.mark.parametrize("kv_cache,batch", [("dense", 3), ("paged", 3), ("paged", 1)])
def test_rows_hold_exactly_the_accepted_tokens(pair, tokenizer, kv_cache, batch):
    """After every step, a speculating row's keys are a fresh prefill's of its
    accepted tokens, and drafts were both accepted and rejected on the way (at
    batch 1 every drafting step drafts in every row: verify_alone)."""
    mlx_model, model = pair
    rng = np.random.default_rng(5)
    prompts = [repeating_prompt(rng, 211, 30) for _ in range(3)]
    _, results, metrics = engine_tokens(
        model,
        tokenizer,
        prompts,
        lambda engine: check_rows(engine, model),
        batch_size=batch,
        kv_cache=kv_cache,
        block_size=4,
        max_tokens=16,
        speculative="ngram",
        num_speculative_tokens=4,
    )
    assert metrics.draft_tokens > metrics.accepted_draft_tokens > 0


# The quote drafts from its second step on: 16 tokens hold several drafted and
# verified rounds beside the plain row (mean accepted length 3.2 here, 2.5 at 24).
QUOTED_TOKENS = 16


@pytest.mark.task(3)
def test_the_embedded_model_quotes_faster_with_the_same_tokens(
    embedded_model, embedded_week2_model, embedded_float32_reference
):
    """A request to repeat a passage: mlx-lm's greedy tokens, most drafts accepted,
    fewer steps than tokens."""
    _, tokenizer = embedded_model
    model = embedded_week2_model(False)
    passage = (
        "The lighthouse keeper climbed the spiral stairs every evening at dusk, "
        "trimmed the wick, polished the great lens and wrote the weather in his log."
    )
    prompts = [
        prompt_token_ids(tokenizer, f"Repeat this sentence exactly: {passage}"),
        prompt_token_ids(tokenizer, "Name three colours."),
    ]
    engine = tiny.Engine(
        model,
        tokenizer,
        policy="mixed",
        kv_cache="paged",
        batch_size=2,
        max_tokens=QUOTED_TOKENS,
        max_seq_len=256,
        speculative="ngram",
    )
    steps = 0
    ids = [engine.add_request(p) for p in prompts]
    results = {}
    while engine.has_unfinished():
        for output in engine.step():
            if output.result is not None:
                results[output.request_id] = output.result
        check_rows(engine)
        check_pool(engine)
        steps += 1
    quoted = results[ids[0]]
    for prompt, request_id in zip(prompts, ids):
        tokens, gaps = expected_tokens(
            embedded_float32_reference, [prompt], QUOTED_TOKENS, tokenizer
        )[0]
        assert_same_tokens(results[request_id].tokens, tokens, gaps, "embedded")
    assert quoted.metrics.accepted_draft_tokens >= len(quoted.tokens) // 2
    assert engine.metrics.mean_accepted_length > 2


@pytest.mark.task(3)
def test_eos_inside_an_accepted_run_ends_the_request_there(pair, tokenizer):
    """Drafts [a, EOS, b] that the model agrees with: a is kept, EOS finishes the
    request, b is never taken."""
    _, model = pair
    request = tiny.Request(model, tokenizer, [5, 6, 7], prefill_max_step=None)
    request.try_prefill()
    eos = sorted(tokenizer.eos_token_ids)[0]
    a, b = (eos + 3) % 211, (eos + 4) % 211
    rows = [a, eos, b, a]
    logits = mx.full((4, 211), -5.0)
    for row, token in enumerate(rows):
        logits[row, token] = 5.0
    before, offset = list(request.generated), request.offset
    accepted = tiny.accept_drafts(request, [a, eos, b], logits)
    assert request.finish_reason == "stop"
    assert request.generated == before + [a]
    assert accepted == 1 and request.offset == offset + 2


@pytest.mark.task(3)
def test_max_tokens_and_unknown_samplers_bound_the_drafts(pair, tokenizer):
    """No draft reaches past max_tokens; a sampler that is a plain function never
    drafts (its distribution is unknown) and still gives its tokens."""
    mlx_model, model = pair
    prompt = repeating_prompt(np.random.default_rng(2), 211, 30)
    specs = [
        PromptSpec(prompt, max_tokens=3),
        PromptSpec(prompt, max_tokens=12, sampler=lambda lp: mx.argmax(lp, axis=-1)),
    ]
    engine = tiny.Engine(
        model,
        tokenizer,
        policy="mixed",
        speculative="ngram",
        num_speculative_tokens=8,
        max_seq_len=128,
    )
    seen = []
    engine.on_forward = lambda record: seen.extend(record.drafts)
    results = run_engine(engine, specs)
    assert len(results[0].tokens) <= 3 and all(fed <= 2 for _, fed, _ in seen)
    assert results[1].metrics.draft_tokens == 0
    (tokens, gaps), _ = expected_tokens(mlx_model, [prompt] * 2, 12, tokenizer)
    assert_same_tokens(results[1].tokens, tokens, gaps, "a plain-function sampler")


@pytest.mark.task(3)
def test_a_request_with_sampling_options_never_drafts(pair, tokenizer):
    """Penalties and logprobs go one token at a time: a request with options
    proposes no drafts (may_draft reads sampling_state.allows_drafts) and gets its
    tokens all the same, while the plain request beside it drafts."""
    assert not tiny.may_draft(drafting_request_with(SamplingOptions(logprobs=0)), 1)
    mlx_model, model = pair
    # Every token of the vocabulary is in the prompt: each generated token has an
    # earlier occurrence, so prompt lookup always proposes drafts.
    prompt = np.random.default_rng(2).permutation(211).tolist()
    specs = [
        PromptSpec(prompt, max_tokens=12),
        PromptSpec(prompt, max_tokens=12, options=SamplingOptions(logprobs=1)),
    ]
    engine = tiny.Engine(
        model, tokenizer, policy="mixed", speculative="ngram", max_seq_len=256
    )
    plain, logged = run_engine(engine, specs)
    assert plain.metrics.draft_tokens > 0 and logged.metrics.draft_tokens == 0
    (tokens, gaps), _ = expected_tokens(mlx_model, [prompt] * 2, 12, tokenizer)
    assert_same_tokens(logged.tokens, tokens, gaps, "a request with logprobs")
    assert [entry.token for entry in logged.logprobs] == logged.tokens


class BrokenSampler(tiny.TokenSampler):
    def logits(self, logprobs):
        raise RuntimeError("this sampler is broken")


@pytest.mark.task(3)
def test_a_failing_verification_fails_that_request_alone(pair, tokenizer):
    mlx_model, model = pair
    rng = np.random.default_rng(9)
    prompts = [repeating_prompt(rng, 211, 24) for _ in range(3)]
    specs = [PromptSpec(p, max_tokens=10) for p in prompts]
    specs[1].sampler = BrokenSampler(1.0)
    engine = tiny.Engine(
        model, tokenizer, policy="mixed", speculative="ngram", max_seq_len=128
    )
    results = run_engine(engine, specs)
    assert results[1].finish_reason == "error"
    assert "broken" in results[1].error
    for i in (0, 2):
        ((tokens, gaps),) = expected_tokens(mlx_model, [prompts[i]], 10, tokenizer)
        assert_same_tokens(results[i].tokens, tokens, gaps, f"prompt {i}")


@pytest.mark.task(3)
@pytest.mark.parametrize("temp", [1.0])
def test_sampled_engine_tokens_follow_the_model(tokenizer, temp):
    """A vocabulary of 8 and temp 1: the third generated token's frequencies over
    many requests (most of them speculating) match the exact distribution computed
    from mlx-lm's logits, EOS ending a request early counted apart, chi-square."""
    mlx_model = sharpened(random_model("qwen2", 32, 2, 1, 48, 1, 8, False, seed=11))
    for module_name, module in mlx_model.named_modules():
        if module_name.endswith("norm"):
            module.weight = mx.full(module.weight.shape, 0.5)
    model = tiny.Qwen2ModelWeek2(mlx_model, weights="float32")
    prompt = [0, 1, 2, 3, 4, 5, 6, 7, 1, 2]

    [eos] = [t for t in tokenizer.eos_token_ids if t < 8]
    expected = third_token_distribution(mlx_model, prompt, eos, temp)
    sampler = tiny.make_sampler(temp)
    engine = tiny.Engine(
        model,
        tokenizer,
        policy="mixed",
        batch_size=32,
        max_seq_len=32,
        speculative="ngram",
        num_speculative_tokens=2,
    )
    mx.random.seed(1)
    # Ten arrive a step, about as many as finish: the slots stay full and the
    # waiting queue short (the planner scans it for every request it places, and
    # 800 waiting at once made this test quadratic).
    specs = [
        PromptSpec(prompt, max_tokens=3, sampler=sampler, arrival_step=i // 10)
        for i in range(800)
    ]
    results = run_engine(engine, specs)
    counts = third_token_counts(results, eos)
    statistic, freedom = chi_square(counts, expected)
    assert engine.metrics.drafts > 200
    assert statistic < CHI_SQUARE_999[freedom], (counts, expected * 800)


@pytest.mark.task(3)
def test_bad_speculative_settings_say_what_to_do():
    with pytest.raises(ValueError, match="speculative must be None, 'ngram'"):
        EngineConfig(policy="mixed", speculative="eagle")
    with pytest.raises(ValueError, match="policy='mixed'"):
        EngineConfig(speculative="ngram")
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        EngineConfig(policy="mixed", speculative="ngram", num_speculative_tokens=0)
    with pytest.raises(ValueError, match="prompt_lookup_max"):
        EngineConfig(policy="mixed", prompt_lookup_max=1, prompt_lookup_min=2)
