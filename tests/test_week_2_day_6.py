"""Week 2 Day 6: continuous batching with batch_generate, each prompt prefilled whole.

Reference: mlx-lm's own greedy generation (`stream_generate`) of each prompt alone,
on the same weights: the embedded SmolLM2 dequantized to float32 for text prompts,
and a random mlx-lm model fed token-id prompts (with the embedded tokenizer) for the
edge cases. `on_step` snapshots show the slots filling, freeing and filling again.
"""

import mlx.core as mx
import mlx_lm
import numpy as np
import pytest
from mlx_lm.sample_utils import make_sampler as mlx_lm_make_sampler

from tiny_llm_base.mlx_lm_reference import chat_ids

from .random_models import SIZES, random_model
from .solution import tiny

pytestmark = pytest.mark.task(4)

QUESTIONS = [
    "What is the capital of France?",
    "Hi!",
    "Write one sentence about the sea.",
    "List three prime numbers.",
]
MAX_TOKENS = 8
BATCH_SIZE = 2


def mlx_lm_answer(mlx_model, tokenizer, prompt: list[int], max_tokens: int):
    """mlx-lm alone: (generated token ids without EOS, text, finish reason)."""
    tokens, text, finish_reason = [], "", None
    for response in mlx_lm.stream_generate(
        mlx_model,
        tokenizer,
        prompt,
        max_tokens=max_tokens,
        sampler=mlx_lm_make_sampler(temp=0.0),
    ):
        text += response.text
        finish_reason = response.finish_reason
        if finish_reason != "stop":
            tokens.append(response.token)
    return tokens, text, finish_reason


def running(snapshot) -> list[int]:
    return [view.request for view in snapshot.slots if view is not None]


def always(token: int, seen: list[mx.array] | None = None):
    """A sampler that returns `token` whatever it is given (and keeps its inputs)."""

    def sample(logprobs: mx.array) -> mx.array:
        if seen is not None:
            seen.append(logprobs)
        return mx.full((logprobs.shape[0],), token, mx.int32)

    return sample


@pytest.fixture(scope="module")
def embedded_run(embedded_model, embedded_week2_model, embedded_float32_reference):
    """Our batch run and mlx-lm's answers, one prompt at a time, on the same weights."""
    tokenizer = embedded_model[1]
    model = embedded_week2_model(False)
    snapshots = []
    results = tiny.batch_generate(
        model,
        tokenizer,
        QUESTIONS,
        batch_size=BATCH_SIZE,
        prefill_step=None,
        max_seq_len=128,
        max_tokens=MAX_TOKENS,
        on_step=snapshots.append,
    )
    expected = [
        mlx_lm_answer(
            embedded_float32_reference, tokenizer, chat_ids(tokenizer, q), MAX_TOKENS
        )
        for q in QUESTIONS
    ]
    return results, snapshots, expected, tokenizer


def test_results_in_prompt_order_match_mlx_lm_alone(embedded_run):
    results, _, expected, tokenizer = embedded_run
    assert len(results) == len(QUESTIONS)
    for question, result, (tokens, text, finish_reason) in zip(
        QUESTIONS, results, expected
    ):
        assert result.tokens == tokens, f"{question!r}: greedy tokens differ"
        assert result.text == text
        assert result.finish_reason == finish_reason
        assert result.error is None
        assert result.metrics.prompt_tokens == len(chat_ids(tokenizer, question))
    assert "Paris" in results[0].text
    assert results.metrics is not None


def test_a_freed_slot_is_taken_at_once(embedded_run):
    results, snapshots, _, _ = embedded_run
    assert snapshots, "on_step was never called"
    assert snapshots[-1].finished == snapshots[-1].total == len(QUESTIONS)
    everyone = set(range(len(QUESTIONS)))
    seen = set()  # requests that held a slot before this step
    for step, snapshot in enumerate(snapshots):
        now = running(snapshot)
        assert len(snapshot.slots) == BATCH_SIZE
        assert len(now) == len(set(now)), f"step {step}: a request holds two slots"
        finished = set(running(snapshots[step - 1])) - set(now) if step else set()
        unstarted = everyone - seen
        if finished and unstarted:
            # One of them takes the free slot in this iteration or in the next.
            later = running(snapshots[step + 1]) if step + 1 < len(snapshots) else []
            assert (set(now) | set(later)) & unstarted, (
                f"step {step}: request(s) {finished} finished but none of the "
                f"waiting requests {sorted(unstarted)} took the free slot"
            )
        seen |= set(now)
    assert seen == everyone
    assert all(len(r.tokens) > 0 for r in results)


@pytest.fixture(scope="module")
def small(embedded_model):
    """(mlx-lm random model, our model on it, the embedded tokenizer, prompt maker)."""
    reference = random_model(*SIZES[0], seed=0)
    model = tiny.Qwen2ModelWeek2(reference, weights="float32")
    vocab = reference.args.vocab_size

    def prompt(length: int, seed: int) -> list[int]:
        return np.random.default_rng(seed).integers(3, vocab, length).tolist()

    return reference, model, embedded_model[1], prompt


def test_per_request_max_tokens_and_sampler(small):
    _, model, tokenizer, prompt = small
    seen = []
    specs = [
        tiny.PromptSpec(prompt(7, 1), max_tokens=3, sampler=always(5, seen)),
        tiny.PromptSpec(prompt(4, 2), sampler=always(9)),
        prompt(9, 3),
        tiny.PromptSpec(prompt(5, 4), max_tokens=2),
    ]
    results = tiny.batch_generate(
        model,
        tokenizer,
        specs,
        batch_size=2,
        prefill_step=None,
        max_seq_len=32,
        max_tokens=4,
        sampler=always(11),
    )
    assert [r.tokens for r in results] == [[5] * 3, [9] * 4, [11] * 4, [11] * 2]
    assert [r.finish_reason for r in results] == ["length"] * 4
    # A sampler sees one row of log-probabilities at a time.
    assert len(seen) == 3
    for logprobs in seen:
        assert logprobs.shape == (1, model.args.vocab_size)
        np.testing.assert_allclose(
            np.array(mx.logsumexp(logprobs, axis=-1)), 0.0, atol=1e-4
        )


def test_eos_as_first_token_finishes_cleanly(small):
    reference, model, tokenizer, prompt = small
    eos = next(iter(tokenizer.eos_token_ids))
    others = [prompt(6, 5), prompt(11, 6), prompt(3, 7)]
    snapshots = []
    results = tiny.batch_generate(
        model,
        tokenizer,
        [others[0], tiny.PromptSpec(prompt(8, 8), sampler=always(eos)), *others[1:]],
        batch_size=2,
        prefill_step=None,
        max_seq_len=32,
        max_tokens=5,
        on_step=snapshots.append,
    )
    stopped = results[1]
    assert stopped.finish_reason == "stop"
    assert stopped.tokens == [] and stopped.text == "" and stopped.error is None
    assert all(1 not in running(s) for s in snapshots), "it took a decode slot"
    for ids, result in zip(others, [results[0], *results[2:]]):
        tokens, _, finish_reason = mlx_lm_answer(reference, tokenizer, ids, 5)
        assert result.tokens == tokens
        assert result.finish_reason == finish_reason


@pytest.mark.parametrize(
    "argument, value", [("batch_size", 0), ("max_seq_len", 0), ("batch_size", -3)]
)
def test_bad_arguments_raise_naming_the_argument(small, argument, value):
    _, model, tokenizer, prompt = small
    with pytest.raises(ValueError, match=argument):
        tiny.batch_generate(
            model, tokenizer, [prompt(4, 0)], prefill_step=None, **{argument: value}
        )


def test_no_prompts_give_no_results(small):
    _, model, tokenizer, _ = small
    assert list(tiny.batch_generate(model, tokenizer, [], prefill_step=None)) == []


def test_bad_prompts_fail_alone(small):
    reference, model, tokenizer, prompt = small
    good = [prompt(5, 9), prompt(12, 10)]
    results = tiny.batch_generate(
        model,
        tokenizer,
        [prompt(17, 11), good[0], "", good[1]],
        batch_size=2,
        prefill_step=None,
        max_seq_len=16,
        max_tokens=3,
    )
    too_long, empty = results[0], results[2]
    assert too_long.finish_reason == "error" and too_long.tokens == []
    assert "max_seq_len" in too_long.error
    assert empty.finish_reason == "error" and empty.tokens == []
    assert "empty" in empty.error
    for ids, result in zip(good, [results[1], results[3]]):
        assert result.error is None
        assert result.tokens == mlx_lm_answer(reference, tokenizer, ids, 3)[0]


def test_request_stops_when_the_cache_is_full(small):
    reference, model, tokenizer, prompt = small
    max_seq_len = 9
    prompts = [prompt(6, 12), prompt(3, 13), prompt(9, 14)]
    results = tiny.batch_generate(
        model,
        tokenizer,
        prompts,
        batch_size=2,
        prefill_step=None,
        max_seq_len=max_seq_len,
    )
    for ids, result in zip(prompts, results):
        # Every generated token but the last went through the cache, which is full.
        room = max_seq_len - len(ids) + 1
        expected, _, _ = mlx_lm_answer(reference, tokenizer, ids, room)
        assert len(expected) == room, "the reference stopped early: pick other prompts"
        assert result.finish_reason == "max_seq_len"
        assert result.tokens == expected


class RecordingModel:
    """Passes every call through to the model and keeps the input shapes."""

    def __init__(self, model):
        self.model = model
        self.input_shapes = []

    def __call__(self, inputs, offset, cache, **options):
        self.input_shapes.append(tuple(inputs.shape))
        return self.model(inputs, offset, cache, **options)

    def __getattr__(self, name):
        return getattr(self.model, name)


def test_prefill_step_none_prefills_each_prompt_in_one_call(small):
    reference, model, tokenizer, prompt = small
    prompts = [prompt(150, 15), prompt(7, 16)]  # longer than any default chunk
    recording = RecordingModel(model)
    results = tiny.batch_generate(
        recording,
        tokenizer,
        prompts,
        batch_size=2,
        prefill_step=None,
        max_seq_len=200,
        max_tokens=3,
    )
    prefill_shapes = [shape for shape in recording.input_shapes if shape[1] > 1]
    assert sorted(prefill_shapes) == [(1, 7), (1, 150)]
    for ids, result in zip(prompts, results):
        assert result.tokens == mlx_lm_answer(reference, tokenizer, ids, 3)[0]


def first_token_times(small, batch_patience: float) -> tuple[float, list]:
    """One slot; an interactive and a batch request at time 0, then one more
    interactive request before each step; a fake clock ticks 1 s a step. Returns the
    batch request's first-token time and (arrival, first-token time) of every
    interactive one."""
    _, model, tokenizer, prompt = small
    now = [0.0]
    engine = tiny.Engine(
        model,
        tokenizer,
        batch_size=1,
        prefill_step=None,
        batch_patience=batch_patience,
        clock=lambda: now[0],
    )

    def add(priority: str, max_tokens: int) -> int:
        spec = tiny.PromptSpec(
            prompt(5, len(engine.ids)), max_tokens=max_tokens, priority=priority
        )
        return engine.add_request(spec)

    interactive = [add("interactive", 2)]
    batch = add("batch", 2)
    results = {}
    for step in range(200):
        if step < 30:
            interactive.append(add("interactive", 2))
        if not engine.has_unfinished():
            break
        for output in engine.step():
            if output.result is not None:
                results[output.request_id] = output.result
        now[0] += 1.0
    assert not engine.has_unfinished()
    times = {
        i: (r.metrics.arrival, r.metrics.token_times[0]) for i, r in results.items()
    }
    return times[batch][1], [times[i] for i in interactive]


def test_a_batch_request_yields_to_interactive_ones_only_within_its_patience(small):
    """by_urgency sorts by deadline: a batch request arriving at 0 with a patience
    of 5 s goes after interactive requests that arrive before 5 s, before every later
    one, so a stream of interactive requests cannot starve it."""
    batch_first, interactive = first_token_times(small, batch_patience=5.0)
    before = [first for arrival, first in interactive if arrival < 5.0]
    after = [first for arrival, first in interactive if arrival >= 5.0]  # a tie: order
    assert before and after
    assert max(before) < batch_first < min(after)
    batch_first, interactive = first_token_times(small, batch_patience=1000.0)
    assert batch_first > max(first for _, first in interactive)
