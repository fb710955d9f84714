"""Week 2 Day 7: chunked prefill, chunk-size policies, metrics and priorities.

Generated tokens are compared with mlx-lm's own models generating each prompt alone
(greedy, float32), so any chunk size, batch size or schedule must give the same
tokens. Times come from a fake clock that a model call advances by one unit per
input position, which makes every metric an exact number.

`pdm run test --week 2 --day 7 -- -k chunked_prefill` runs the chunked-prefill tests.
"""

import io
import math

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mlx_lm.models.cache import make_prompt_cache

from tiny_llm_base import SamplingOptions
from tiny_llm_base.mlx_lm_reference import chat_ids

from .helpers import (
    assert_prompt_logprobs,
    assert_same_tokens,
    expected_tokens,
    token_ids,
)
from .solution import tiny

LONG_PROMPT = (
    "Here are my notes from a week of baking. On Monday the sourdough starter "
    "bubbled slowly, so I fed it twice with rye flour. On Tuesday the loaf spread "
    "flat because the dough was too wet. On Wednesday I lowered the water to "
    "seventy percent, folded the dough four times and baked it in a covered pot: "
    "the crumb was open and the crust crackled. On Thursday a whole wheat loaf "
    "rose well but tasted bitter. On Friday I made focaccia with olive oil and "
    "rosemary, which everyone liked best. Which change helped the bread most?"
)
EMBEDDED_PROMPTS = [
    "What is the capital of France?",
    LONG_PROMPT,
    "Name three primary colors.",
]


# --- references and helpers -------------------------------------------------------


def mlx_lm_cache(cache) -> tuple[mx.array, mx.array]:
    """An mlx-lm KVCache's stored keys and values: [B, H, offset, D]."""
    return cache.keys[:, :, : cache.offset], cache.values[:, :, : cache.offset]


def pending_ops(array: mx.array) -> int:
    """How many operations MLX has yet to run to produce `array`.

    export_to_dot draws every unevaluated operation as a rectangle; an evaluated
    array has none.
    """
    dot = io.StringIO()
    mx.export_to_dot(dot, array)
    return dot.getvalue().count("shape=rectangle")


class TimedModel:
    """A model whose every call advances a fake clock by one unit per input position.

    A prefill chunk of L tokens costs L, a decode step 1. `clock` goes to
    batch_generate, so every time it reports is exact. `lengths` logs each call's L.
    """

    def __init__(self, model):
        self.model = model
        self.now = 0.0
        self.lengths: list[int] = []

    def clock(self) -> float:
        return self.now

    def create_kv_cache(self):
        return self.model.create_kv_cache()

    def __getattr__(self, name):  # vocab_size, context_length
        return getattr(self.model, name)

    def __call__(self, inputs, offset, cache, **options):
        self.now += inputs.shape[1]
        self.lengths.append(inputs.shape[1])
        return self.model(inputs, offset, cache, **options)


# --- fixtures ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def qwen2_pairs(random_pairs):
    """The random pairs whose model is a Qwen2."""
    return [pair for pair in random_pairs if pair[0].args.model_type == "qwen2"]


# --- Request.try_prefill ----------------------------------------------------------


@pytest.mark.task(1)
def test_chunked_prefill_try_prefill_advances_offset_one_chunk_at_a_time(
    pair, tokenizer
):
    mlx_model, model = pair
    prompt = token_ids(np.random.default_rng(1), mlx_model.args.vocab_size, 19)
    request = tiny.Request(model, tokenizer, prompt, prefill_max_step=5)
    assert request.offset == 0 and not request.is_prefill_done
    processed, offsets = [], []
    while not request.is_prefill_done:
        assert request.next_token is None and request.generated == []
        processed.append(request.try_prefill())
        offsets.append(request.offset)
    assert processed == [5, 5, 5, 4]
    assert offsets == [5, 10, 15, 19]
    with pytest.raises(ValueError):
        request.try_prefill()


@pytest.mark.task(1)
def test_chunked_prefill_try_prefill_max_step_overrides_the_default(pair, tokenizer):
    mlx_model, model = pair
    prompt = token_ids(np.random.default_rng(2), mlx_model.args.vocab_size, 12)
    request = tiny.Request(model, tokenizer, prompt, prefill_max_step=5)
    assert request.try_prefill(max_step=2) == 2
    assert request.try_prefill() == 5
    assert request.try_prefill(max_step=100) == 5
    assert request.is_prefill_done and request.offset == 12
    whole = tiny.Request(model, tokenizer, prompt, prefill_max_step=None)
    assert whole.try_prefill() == 12 and whole.is_prefill_done


@pytest.mark.task(1)
@pytest.mark.parametrize("step", [1, 4, 23, None])
def test_chunked_prefill_last_chunk_samples_mlx_lm_argmax(pair, tokenizer, step):
    mlx_model, model = pair
    prompt = token_ids(np.random.default_rng(3), mlx_model.args.vocab_size, 23)
    expected = mx.argmax(mlx_model(mx.array([prompt]))[0, -1]).item()
    request = tiny.Request(model, tokenizer, prompt, prefill_max_step=step)
    while not request.is_prefill_done:
        request.try_prefill()
    if expected in tokenizer.eos_token_ids:
        assert request.finish_reason == "stop" and request.generated == []
    else:
        assert request.generated == [expected]
        assert request.next_token == expected


@pytest.mark.task(1)
@pytest.mark.parametrize("step", [1, 4, None])
def test_chunked_prefill_gives_every_prompt_logprob_once(pair, tokenizer, step):
    """A request that wants its prompt's logprobs runs each chunk with every
    position's logits and hands them to its sampling state: chunked or not, each
    prompt token's logprob is mlx-lm's, from one forward over the prompt."""
    mlx_model, model = pair
    prompt = token_ids(np.random.default_rng(4), mlx_model.args.vocab_size, 14)
    options = SamplingOptions(prompt_logprobs=3)
    request = tiny.Request(
        model, tokenizer, prompt, prefill_max_step=step, options=options
    )
    while not request.is_prefill_done:
        request.try_prefill()
    assert_prompt_logprobs(request.sampling_state.prompt_logprobs, prompt, mlx_model, 3)


@pytest.mark.task(1)
def test_chunked_prefill_evaluates_the_cache_after_every_chunk(pair, tokenizer):
    mlx_model, model = pair
    prompt = token_ids(np.random.default_rng(4), mlx_model.args.vocab_size, 17)
    request = tiny.Request(model, tokenizer, prompt, prefill_max_step=6)
    for _ in range(2):  # two of the three chunks: the cache is still the request's
        request.try_prefill()
        for layer, cache in enumerate(request.kv_cache):
            # fetch() may slice the evaluated storage: one pending op at most. A
            # lazy cache still holds the layer's projections, RoPE, the write...
            pending = [pending_ops(array) for array in cache.fetch()]
            assert max(pending) <= 1, (
                f"layer {layer}: the cache still holds a lazy graph after a chunk "
                f"({pending} pending operations in keys, values); mx.eval it so "
                "the graph never spans chunks"
            )


@pytest.mark.task(1)
@pytest.mark.parametrize("step", [1, 3, 8])
def test_chunked_prefill_cache_equals_whole_prompt_cache(pair, tokenizer, no_eos, step):
    mlx_model, model = pair
    sampler, _ = no_eos  # no EOS: the request keeps its cache after the last chunk
    prompt = token_ids(np.random.default_rng(5), mlx_model.args.vocab_size, 21)
    reference_cache = make_prompt_cache(mlx_model)
    mlx_model(mx.array([prompt]), cache=reference_cache)
    whole = tiny.Request(
        model, tokenizer, prompt, prefill_max_step=None, sampler=sampler
    )
    whole.try_prefill()
    chunked = tiny.Request(
        model, tokenizer, prompt, prefill_max_step=step, sampler=sampler
    )
    while not chunked.is_prefill_done:
        chunked.try_prefill()
    for layer, (ours, unchunked, reference) in enumerate(
        zip(chunked.kv_cache, whole.kv_cache, reference_cache)
    ):
        for name, got, plain, want in zip(
            ("keys", "values"), ours.fetch(), unchunked.fetch(), mlx_lm_cache(reference)
        ):
            assert got.shape == want.shape == (1, want.shape[1], 21, want.shape[3])
            for other in (plain, want):
                np.testing.assert_allclose(
                    np.array(got),
                    np.array(other),
                    atol=1e-5,
                    rtol=1e-5,
                    err_msg=f"layer {layer} {name}, prefill_max_step={step}",
                )


# --- the property: chunking never changes the tokens -------------------------------


@pytest.mark.task(1)
@settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_chunked_prefill_tokens_do_not_depend_on_chunk_or_batch_size(
    qwen2_pairs, tokenizer, data
):
    index = data.draw(st.integers(0, len(qwen2_pairs) - 1), label="model")
    mlx_model, model = qwen2_pairs[index]
    vocab = mlx_model.args.vocab_size
    prompts = data.draw(
        st.lists(
            st.lists(st.integers(0, vocab - 1), min_size=1, max_size=40),
            min_size=1,
            max_size=6,
        ),
        label="prompts",
    )
    prefill_step = data.draw(st.sampled_from([1, 2, 7, 32, 128, None]), label="step")
    batch_size = data.draw(st.sampled_from([1, 3, 5]), label="batch_size")
    max_tokens = data.draw(st.integers(1, 6), label="max_tokens")
    results = tiny.batch_generate(
        model,
        tokenizer,
        prompts,
        batch_size=batch_size,
        prefill_step=prefill_step,
        max_seq_len=64,
        max_tokens=max_tokens,
    )
    expected = expected_tokens(mlx_model, prompts, max_tokens, tokenizer)
    for i, (result, (tokens, gaps)) in enumerate(zip(results, expected)):
        assert_same_tokens(result.tokens, tokens, gaps, f"prompt {i}")
        assert result.finish_reason in ("stop", "length")


@pytest.fixture(scope="module")
def embedded_setup(embedded_model, embedded_week2_model, embedded_float32_reference):
    """The float32 tiny model, and mlx-lm's greedy tokens on a float32 copy."""
    tokenizer = embedded_model[1]
    model = embedded_week2_model(True)
    prompts = [chat_ids(tokenizer, p) for p in EMBEDDED_PROMPTS]
    assert len(prompts[1]) >= 140
    expected = expected_tokens(embedded_float32_reference, prompts, 6, tokenizer)
    return model, tokenizer, expected


# Chunks beside other rows, chunks alone, no chunks: every chunk and batch size
# together is the property above's, on random models.
@pytest.mark.task(1)
@pytest.mark.parametrize("prefill_step, batch_size", [(7, 3), (32, 1), (None, 3)])
def test_chunked_prefill_embedded_model_matches_mlx_lm(
    embedded_setup, prefill_step, batch_size
):
    model, tokenizer, expected = embedded_setup
    results = tiny.batch_generate(
        model,
        tokenizer,
        EMBEDDED_PROMPTS,
        batch_size=batch_size,
        prefill_step=prefill_step,
        max_seq_len=256,
        max_tokens=6,
    )
    for i, (result, (tokens, gaps)) in enumerate(zip(results, expected)):
        assert_same_tokens(result.tokens, tokens, gaps, f"prompt {i}")
        assert result.text == tokenizer.decode(result.tokens)


# --- choosing the chunk size --------------------------------------------------------


@pytest.mark.task(1)
@pytest.mark.parametrize(
    "sequence_length, active, batch_size, expected",
    [
        (100, 0, 5, 128),
        (100, 4, 5, 128),  # 80% decoding is not more than 80%
        (100, 5, 5, 64),
        (5000, 5, 5, 64),  # decoders come first
        (2048, 0, 5, 128),
        (2049, 0, 5, 256),
        (3000, 1, 2, 256),
        (10, 2, 2, 64),
        (10, 9, 10, 64),
    ],
)
def test_select_chunk_size(sequence_length, active, batch_size, expected):
    assert tiny.select_chunk_size(sequence_length, active, batch_size) == expected


@pytest.mark.task(2)
def test_adaptive_chunker_keeps_its_size_without_measurements():
    chunker = tiny.AdaptiveChunker(initial_chunk_size=64, min_chunk_size=8)
    assert chunker.select_chunk_size(0, 4) == 64
    assert chunker.select_chunk_size(3, 4) == 64  # 75% is not above 80%


@pytest.mark.task(2)
def test_adaptive_chunker_shrinks_under_decode_pressure():
    chunker = tiny.AdaptiveChunker(
        initial_chunk_size=64, min_chunk_size=8, decode_latency_target=1.0
    )
    sizes = []
    for _ in range(5):
        chunker.record(0.01)  # fast chunks: pressure wins anyway
        sizes.append(chunker.select_chunk_size(5, 5))
    assert sizes == [32, 16, 8, 8, 8]


@pytest.mark.task(2)
def test_adaptive_chunker_grows_under_target_and_shrinks_above_it():
    chunker = tiny.AdaptiveChunker(
        initial_chunk_size=32,
        min_chunk_size=4,
        max_chunk_size=128,
        decode_latency_target=0.05,
    )
    sizes = []
    for _ in range(4):
        chunker.record(0.01)
        sizes.append(chunker.select_chunk_size(0, 4))
    assert sizes == [64, 128, 128, 128]
    for _ in range(7):
        chunker.record(0.2)
        sizes.append(chunker.select_chunk_size(1, 4))
    assert sizes[4:] == [64, 32, 16, 8, 4, 4, 4]


@pytest.mark.task(2)
def test_adaptive_chunker_uses_a_window_of_recent_times():
    chunker = tiny.AdaptiveChunker(
        initial_chunk_size=16, min_chunk_size=8, max_chunk_size=64, window=2
    )
    for seconds in (10.0, 10.0, 0.01, 0.01):
        chunker.record(seconds)
    assert chunker.select_chunk_size(0, 4) == 32  # the slow chunks left the window


@pytest.mark.task(2)
@pytest.mark.parametrize(
    "sizes", [(0, 16, 64), (32, 16, 64), (8, 128, 64), (16, 8, 64)]
)
def test_adaptive_chunker_rejects_inconsistent_sizes(sizes):
    minimum, initial, maximum = sizes
    with pytest.raises(ValueError):
        tiny.AdaptiveChunker(
            initial_chunk_size=initial, min_chunk_size=minimum, max_chunk_size=maximum
        )


@pytest.mark.task(2)
def test_chunked_prefill_adaptive_chunker_follows_fake_chunk_times(
    pair, tokenizer, no_eos
):
    """A chunk of L positions takes L ms here: under the 50 ms target it doubles."""
    mlx_model, model = pair
    sampler, banned = no_eos
    timed = TimedModel(model)
    prompt = token_ids(np.random.default_rng(6), mlx_model.args.vocab_size, 60)
    chunker = tiny.AdaptiveChunker(
        initial_chunk_size=4,
        min_chunk_size=2,
        max_chunk_size=16,
        decode_latency_target=50,
    )
    results = tiny.batch_generate(
        timed,
        tokenizer,
        [prompt],
        batch_size=1,
        prefill_step=chunker,
        max_tokens=3,
        sampler=sampler,
        clock=timed.clock,
    )
    assert timed.lengths == [4, 8, 16, 16, 16, 1, 1]
    ((tokens, gaps),) = expected_tokens(mlx_model, [prompt], 3, tokenizer, banned)
    assert_same_tokens(results[0].tokens, tokens, gaps, "prompt 0")


@pytest.mark.task(2)
@pytest.mark.parametrize("policy", ["select_chunk_size", "adaptive"])
def test_chunked_prefill_policies_keep_the_tokens(qwen2_pairs, tokenizer, policy):
    mlx_model, model = qwen2_pairs[1]
    rng = np.random.default_rng(7)
    prompts = [token_ids(rng, mlx_model.args.vocab_size, n) for n in (150, 9, 70, 31)]
    prefill_step = (
        tiny.select_chunk_size
        if policy == "select_chunk_size"
        else tiny.AdaptiveChunker(
            initial_chunk_size=8, min_chunk_size=2, max_chunk_size=32
        )
    )
    results = tiny.batch_generate(
        model,
        tokenizer,
        prompts,
        batch_size=2,
        prefill_step=prefill_step,
        max_seq_len=200,
        max_tokens=5,
    )
    expected = expected_tokens(mlx_model, prompts, 5, tokenizer)
    for i, (result, (tokens, gaps)) in enumerate(zip(results, expected)):
        assert_same_tokens(result.tokens, tokens, gaps, f"prompt {i}")


# --- metrics on a fake clock ------------------------------------------------------


@pytest.mark.task(1)
def test_chunked_prefill_metrics_on_a_fake_clock(pair, tokenizer, no_eos):
    """Two prompts (10 and 3 tokens), chunks of 4, two slots, 3 tokens each.

    Numbered like SchedulerSnapshot.step (iterations done, 1 after the first):
    step 1: A[0:4]  t 0->4      step 2: A[4:8]  t ->8
    step 3: A[8:10] t ->10, A's token 1 at 10; decode A: token 2 at 11
    step 4: B[0:3]  t ->14, B's token 1 at 14; decode A, B: A's 3rd and B's 2nd at 15
    step 5: decode B: its 3rd at 16
    """
    mlx_model, model = pair
    sampler, banned = no_eos
    timed = TimedModel(model)
    rng = np.random.default_rng(8)
    prompts = [token_ids(rng, mlx_model.args.vocab_size, n) for n in (10, 3)]
    results = tiny.batch_generate(
        timed,
        tokenizer,
        prompts,
        batch_size=2,
        prefill_step=4,
        max_tokens=3,
        sampler=sampler,
        clock=timed.clock,
    )
    a, b = (r.metrics for r in results)
    assert a.arrival == 0 and b.arrival == 0
    assert (a.prompt_tokens, b.prompt_tokens) == (10, 3)
    assert (a.queue_time, b.queue_time) == (0, 11)
    assert (a.time_to_first_token, b.time_to_first_token) == (10, 14)
    assert a.token_times == [10, 11, 15] and b.token_times == [14, 15, 16]
    assert a.inter_token_latencies == [1, 4] and b.inter_token_latencies == [1, 1]
    assert (a.longest_stall, b.longest_stall) == (4, 1)
    assert (a.prefill_chunks, b.prefill_chunks) == (3, 1)
    assert a.generated_tokens == b.generated_tokens == 3

    run = results.metrics
    assert run.prefill_chunks == math.ceil(10 / 4) + math.ceil(3 / 4)
    assert run.prefill_tokens == 13
    assert run.decode_steps == 3
    assert run.interleaving_ratio == pytest.approx(4 / 3)
    assert run.generated_tokens == 6
    assert run.longest_decode_stall == 4
    assert run.prefill_seconds == 13 and run.decode_seconds == 3
    assert run.total_seconds == 16
    # chunk times 4, 4, 2, 3: the first sets the average, each later one weighs 0.1
    assert run.chunk_time_average == pytest.approx(0.9 * (0.9 * 4 + 0.1 * 2) + 0.1 * 3)
    assert run.prompt_throughput == pytest.approx(13 / 16)
    assert run.generation_throughput == pytest.approx(6 / 16)
    assert run.finished == 2 and run.running == 0 and run.waiting == 0
    assert run.peak_memory_bytes > 0
    for result, (tokens, gaps) in zip(
        results, expected_tokens(mlx_model, prompts, 3, tokenizer, banned)
    ):
        assert_same_tokens(result.tokens, tokens, gaps, "fake clock run")


@pytest.mark.task(1)
def test_chunked_prefill_metrics_before_anything_happens():
    metrics = tiny.RequestMetrics()
    assert metrics.queue_time is None and metrics.time_to_first_token is None
    assert metrics.inter_token_latencies == [] and metrics.longest_stall == 0.0
    run = tiny.RunMetrics()
    assert run.interleaving_ratio == float("inf")
    assert run.prompt_throughput == 0.0 and run.generation_throughput == 0.0


@pytest.mark.task(1)
def test_chunked_prefill_interleaving_ratio_counts_chunks(pair, tokenizer, no_eos):
    mlx_model, model = pair
    sampler, _ = no_eos
    rng = np.random.default_rng(9)
    prompts = [token_ids(rng, mlx_model.args.vocab_size, n) for n in (33, 5, 17, 8)]
    for step in (1, 4, 16, None):
        results = tiny.batch_generate(
            model,
            tokenizer,
            prompts,
            batch_size=3,
            prefill_step=step,
            max_tokens=4,
            sampler=sampler,
        )
        chunks = sum(math.ceil(len(p) / (step or len(p))) for p in prompts)
        run = results.metrics
        assert run.prefill_chunks == chunks, f"prefill_step {step}"
        assert [r.metrics.prefill_chunks for r in results] == [
            math.ceil(len(p) / (step or len(p))) for p in prompts
        ]
        assert run.interleaving_ratio == pytest.approx(chunks / run.decode_steps)
        assert run.generated_tokens == sum(len(r.tokens) for r in results) == 16


# --- priorities -------------------------------------------------------------------


@pytest.mark.task(1)
def test_chunked_prefill_interactive_request_jumps_a_long_batch_prefill(
    pair, tokenizer, no_eos
):
    mlx_model, model = pair
    sampler, banned = no_eos
    timed = TimedModel(model)
    rng = np.random.default_rng(10)
    long_prompt = token_ids(rng, mlx_model.args.vocab_size, 24)
    short_prompt = token_ids(rng, mlx_model.args.vocab_size, 3)
    snapshots = []
    results = tiny.batch_generate(
        timed,
        tokenizer,
        [
            tiny.PromptSpec(long_prompt),
            tiny.PromptSpec(short_prompt, priority="interactive", arrival_step=2),
        ],
        batch_size=2,
        prefill_step=4,
        max_tokens=2,
        sampler=sampler,
        on_step=lambda s: snapshots.append((s.step, s.prefilling)),
        clock=timed.clock,
    )
    long_metrics, short_metrics = results[0].metrics, results[1].metrics
    # It arrives at t=8 (two chunks of 4 done) and its 3-token prefill runs at once.
    assert short_metrics.arrival == 8 and short_metrics.queue_time == 0
    assert short_metrics.time_to_first_token == 3
    # The long prompt's first token comes with its last chunk: after the short one's.
    assert short_metrics.token_times[0] < long_metrics.token_times[0]
    assert short_metrics.token_times[-1] < long_metrics.token_times[0]
    # The long prefill paused and resumed at its offset: 6 chunks, no token twice.
    offsets = [p[1] for _, p in snapshots if p is not None and p[0] == 0]
    assert offsets == [4, 8, 12, 16, 20]
    assert results[0].metrics.prefill_chunks == 6
    assert results.metrics.prefill_tokens == 27
    expected = expected_tokens(
        mlx_model, [long_prompt, short_prompt], 2, tokenizer, banned
    )
    for i, (result, (tokens, gaps)) in enumerate(zip(results, expected)):
        assert_same_tokens(result.tokens, tokens, gaps, f"prompt {i}")
        assert result.priority == ("batch", "interactive")[i]


@pytest.mark.task(1)
@pytest.mark.parametrize("reserved", [0, 1])
def test_chunked_prefill_reserved_slot_waits_for_interactive(
    pair, tokenizer, no_eos, reserved
):
    mlx_model, model = pair
    sampler, banned = no_eos
    timed = TimedModel(model)
    rng = np.random.default_rng(11)
    prompts = [token_ids(rng, mlx_model.args.vocab_size, 3) for _ in range(4)]
    specs = [tiny.PromptSpec(p) for p in prompts[:3]] + [
        tiny.PromptSpec(prompts[3], priority="interactive", arrival_step=2)
    ]
    batch_slots_used = []
    results = tiny.batch_generate(
        timed,
        tokenizer,
        specs,
        batch_size=2,
        prefill_step=4,
        max_tokens=4,
        sampler=sampler,
        reserved_interactive_slots=reserved,
        on_step=lambda s: batch_slots_used.append(
            sum(v is not None and v.priority == "batch" for v in s.slots)
        ),
        clock=timed.clock,
    )
    interactive = results[3].metrics
    if reserved:
        assert max(batch_slots_used) == 1
        assert interactive.queue_time == 0
    else:
        assert max(batch_slots_used) == 2  # both slots taken: the interactive waits
        assert interactive.queue_time > 0
    expected = expected_tokens(mlx_model, prompts, 4, tokenizer, banned)
    for i, (result, (tokens, gaps)) in enumerate(zip(results, expected)):
        assert_same_tokens(result.tokens, tokens, gaps, f"prompt {i}")


@pytest.mark.task(1)
def test_chunked_prefill_reserved_slots_limit_batch_requests_not_interactive_ones(
    pair, tokenizer, no_eos
):
    """reserved_interactive_slots=k caps the slots batch requests hold at
    batch_size - k, even with no interactive request in the run; it does not confine
    interactive requests to k slots: they may take any free one."""
    mlx_model, model = pair
    sampler, banned = no_eos
    rng = np.random.default_rng(15)
    prompts = [token_ids(rng, mlx_model.args.vocab_size, 3) for _ in range(6)]

    def run(specs, max_tokens):
        held = []  # per iteration: (slots held by batch, by interactive requests)
        results = tiny.batch_generate(
            model,
            tokenizer,
            specs,
            batch_size=3,
            prefill_step=None,
            max_tokens=max_tokens,
            sampler=sampler,
            reserved_interactive_slots=1,
            on_step=lambda s: held.append(
                tuple(
                    sum(v is not None and v.priority == kind for v in s.slots)
                    for kind in ("batch", "interactive")
                )
            ),
        )
        return results, held

    # Batch requests only, long enough to overlap: one slot stays free although no
    # interactive request will ever use it.
    results, held = run(prompts[:4], max_tokens=8)
    assert max(batch for batch, _ in held) == 2
    expected = expected_tokens(mlx_model, prompts[:4], 8, tokenizer, banned)
    for i, (result, (tokens, gaps)) in enumerate(zip(results, expected)):
        assert_same_tokens(result.tokens, tokens, gaps, f"batch only, prompt {i}")

    # Three interactive requests, long enough to overlap, fill all three slots.
    specs = [tiny.PromptSpec(p) for p in prompts[:3]] + [
        tiny.PromptSpec(p, priority="interactive", max_tokens=8) for p in prompts[3:]
    ]
    results, held = run(specs, max_tokens=4)
    assert max(interactive for _, interactive in held) == 3
    assert max(batch for batch, _ in held) <= 2
    expected = expected_tokens(mlx_model, prompts[:3], 4, tokenizer, banned)
    expected += expected_tokens(mlx_model, prompts[3:], 8, tokenizer, banned)
    for i, (result, (tokens, gaps)) in enumerate(zip(results, expected)):
        assert_same_tokens(result.tokens, tokens, gaps, f"mixed, prompt {i}")


# --- bad input --------------------------------------------------------------------


@pytest.mark.task(1)
@pytest.mark.parametrize("prefill_step", [0, -3])
def test_chunked_prefill_rejects_a_chunk_size_below_one(pair, tokenizer, prefill_step):
    _, model = pair
    with pytest.raises(ValueError, match="prefill_step"):
        tiny.batch_generate(model, tokenizer, [[1, 2, 3]], prefill_step=prefill_step)
    with pytest.raises(ValueError, match="prefill_max_step"):
        tiny.Request(model, tokenizer, [1, 2, 3], prefill_max_step=prefill_step)


@pytest.mark.task(1)
def test_batch_generate_rejects_batch_size_below_one(pair, tokenizer):
    _, model = pair
    with pytest.raises(ValueError, match="batch_size"):
        tiny.batch_generate(model, tokenizer, [[1, 2, 3]], batch_size=0)


@pytest.mark.task(1)
def test_batch_generate_rejects_a_negative_arrival_step(pair, tokenizer):
    _, model = pair
    with pytest.raises(ValueError, match="arrival_step"):
        tiny.batch_generate(
            model, tokenizer, [tiny.PromptSpec([1, 2, 3], arrival_step=-1)]
        )


@pytest.mark.task(1)
def test_chunked_prefill_bad_prompts_fail_alone(pair, tokenizer):
    mlx_model, model = pair
    good = token_ids(np.random.default_rng(12), mlx_model.args.vocab_size, 9)
    too_long = token_ids(np.random.default_rng(13), mlx_model.args.vocab_size, 40)
    results = tiny.batch_generate(
        model,
        tokenizer,
        ["", [], good, too_long],
        batch_size=2,
        prefill_step=4,
        max_seq_len=32,
        max_tokens=4,
    )
    for result in (results[0], results[1], results[3]):
        assert result.finish_reason == "error"
        assert result.tokens == [] and result.text == ""
        assert isinstance(result.error, str) and result.error
    assert "max_seq_len" in results[3].error
    assert results[2].error is None
    ((tokens, gaps),) = expected_tokens(mlx_model, [good], 4, tokenizer)
    assert_same_tokens(results[2].tokens, tokens, gaps, "the good prompt")


@pytest.mark.task(1)
@pytest.mark.parametrize("prefill_step", [3, None])
def test_chunked_prefill_stops_at_max_seq_len(pair, tokenizer, no_eos, prefill_step):
    """10 prompt tokens and max_seq_len 13: the cache holds 3 generated tokens, and
    the 4th is sampled from the last cached position, then the request stops."""
    mlx_model, model = pair
    sampler, banned = no_eos
    prompt = token_ids(np.random.default_rng(14), mlx_model.args.vocab_size, 10)
    results = tiny.batch_generate(
        model,
        tokenizer,
        [prompt],
        batch_size=2,
        prefill_step=prefill_step,
        max_seq_len=13,
        max_tokens=20,
        sampler=sampler,
    )
    assert results[0].finish_reason == "max_seq_len"
    ((tokens, gaps),) = expected_tokens(mlx_model, [prompt], 4, tokenizer, banned)
    assert_same_tokens(results[0].tokens, tokens, gaps, "prompt 0")
