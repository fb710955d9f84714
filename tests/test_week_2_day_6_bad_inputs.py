"""Week 2 Day 6: bad input and faults never cost the other requests their results.

Every case runs through batch_generate with good requests beside the bad one. The
bad request (or the bad argument) must give a clear error; the good requests must
finish with the tokens mlx-lm's greedy generation gives each of them alone, on the
same weights: a random mlx-lm Qwen2 fed token ids (fast), and the embedded SmolLM2
in float32 where the case is about its real vocabulary or context.

40 tests (parametrized ids included): prompts (6, the four out-of-vocabulary ids in
one), samplers and model faults (9), arguments (19), context length (5), the cache's
size (1).
"""

import mlx.core as mx
import numpy as np
import pytest

from tiny_llm_base import DEFAULT_MAX_SEQ_LEN, greedy
from tiny_llm_base.mlx_lm_reference import chat_ids, mlx_lm_greedy

from .random_models import SIZES, random_model
from .solution import tiny

pytestmark = pytest.mark.task(4)

MAX_TOKENS = 4


class Setup:
    """A model, its mlx-lm twin, a tokenizer, and two good prompts with their tokens."""

    def __init__(self, reference, model, tokenizer, good: list[list[int]]):
        self.reference = reference
        self.model = model
        self.tokenizer = tokenizer
        self.good = good
        self.expected = [
            mlx_lm_greedy(reference, ids, MAX_TOKENS, tokenizer.eos_token_ids)[0]
            for ids in good
        ]

    def run(self, bad, position: int = 1, **options):
        """batch_generate of the good prompts with `bad` among them; checks that
        every good prompt got its tokens, and returns the bad prompt's result."""
        return self.run_many([bad], position, **options)[0]

    def run_many(self, bad: list, position: int = 1, **options) -> list:
        """run() with the prompts of `bad` together at `position`: their results."""
        prompts = list(self.good)
        prompts[position:position] = bad
        settings = dict(batch_size=2, prefill_step=None, max_seq_len=64)
        settings.update(options)
        results = tiny.batch_generate(
            self.model, self.tokenizer, prompts, max_tokens=MAX_TOKENS, **settings
        )
        assert len(results) == len(prompts)
        goods = results[:position] + results[position + len(bad) :]
        for number, (result, expected) in enumerate(zip(goods, self.expected)):
            assert result.error is None, f"good prompt {number}: {result.error}"
            assert result.tokens == expected, f"good prompt {number}: tokens differ"
        return results[position : position + len(bad)]

    def call(self, prompts=None, **options):
        """batch_generate of the good prompts (or `prompts`) with these options."""
        return tiny.batch_generate(
            self.model,
            self.tokenizer,
            self.good if prompts is None else prompts,
            **{"prefill_step": None, "max_tokens": MAX_TOKENS, **options},
        )


@pytest.fixture(scope="module")
def small(embedded_model):
    """A random Qwen2 (vocabulary 211, context 4096) with the embedded tokenizer."""
    reference = random_model(*SIZES[0], seed=0)
    model = tiny.Qwen2ModelWeek2(reference, weights="float32")
    rng = np.random.default_rng(0)
    good = [rng.integers(3, 211, n).tolist() for n in (6, 11)]
    return Setup(reference, model, embedded_model[1], good)


@pytest.fixture(scope="module")
def embedded(embedded_model, embedded_week2_model, embedded_float32_reference):
    """The embedded SmolLM2 (vocabulary 49152, context 8192) and two chat prompts."""
    tokenizer = embedded_model[1]
    model = embedded_week2_model(False)
    good = [
        chat_ids(tokenizer, question)
        for question in ("What is the capital of France?", "Name two colors.")
    ]
    return Setup(embedded_float32_reference, model, tokenizer, good)


def assert_failed(result, *words: str) -> None:
    assert result.finish_reason == "error"
    assert isinstance(result.error, str)
    for word in words:
        assert word in result.error, f"{word!r} not in {result.error!r}"


# --- prompts --------------------------------------------------------------------------


def test_out_of_vocabulary_token_ids_fail_alone(embedded):
    """49152 is one past SmolLM2's last id; 10**9 and 2**40 used to kill the
    process. The four bad prompts in one run (the embedded model's steps are the
    slow part), each failing alone, naming its own id."""
    bad_ids = [49152, -5, 10**9, 2**40]
    results = embedded.run_many([[1, 504, bad_id, 42] for bad_id in bad_ids])
    for bad_id, bad in zip(bad_ids, results):
        assert_failed(bad, str(bad_id), "[0, 49152)")
        assert bad.tokens == [] and bad.text == ""


@pytest.mark.parametrize(
    "prompt, words",
    [
        ([5, 3.0, 7], ["3.0", "float"]),
        ([5, 2.5, 7], ["2.5", "float"]),
        ([5, True, 7], ["True", "bool"]),
        (None, ["NoneType"]),
        (17, ["int"]),
    ],
    ids=["float-3.0", "float-2.5", "bool", "None", "int"],
)
def test_prompt_of_the_wrong_type_fails_alone(small, prompt, words):
    assert_failed(small.run(prompt), *words)


# --- samplers and model faults --------------------------------------------------------


def sampler_failing_on_call(number: int):
    calls = 0

    def sample(logprobs: mx.array) -> mx.array:
        nonlocal calls
        calls += 1
        if calls == number:
            raise RuntimeError(f"sampler broke on call {number}")
        return greedy(logprobs)

    return sample


@pytest.mark.parametrize("call", [1, 2], ids=["prefill", "decode"])
def test_sampler_that_raises_fails_its_request_alone(small, call):
    """Call 1 samples the first token after the prefill, call 2 the decode step's."""
    ids = small.good[0][::-1]
    first_tokens = mlx_lm_greedy(small.reference, ids, MAX_TOKENS, [])[0][: call - 1]
    bad = small.run(tiny.PromptSpec(ids, sampler=sampler_failing_on_call(call)))
    assert_failed(bad, f"sampler broke on call {call}")
    assert bad.tokens == first_tokens


@pytest.mark.parametrize(
    "sampler, words",
    [
        (lambda logprobs: mx.array([float("nan")]), ["nan", "float32", "mx.argmax"]),
        (lambda logprobs: 7, ["int", "mx.array"]),
        (lambda logprobs: mx.array([211]), ["211", "[0, 211)"]),
        (lambda logprobs: mx.array([1, 2]), ["shape (2,)"]),
        ("greedy", ["callable", "str"]),
    ],
    ids=["nan", "python-int", "out-of-vocabulary", "two-ids", "not-callable"],
)
def test_sampler_returning_no_token_id_fails_its_request_alone(small, sampler, words):
    bad = small.run(tiny.PromptSpec(small.good[0][::-1], sampler=sampler))
    assert_failed(bad, *words)


class FaultyModel:
    """Passes calls through to the model, but raises in the calls `fails` picks."""

    def __init__(self, model, fails):
        self.model = model
        self.fails = fails
        self.calls = 0

    def __getattr__(self, name):
        return getattr(self.model, name)

    def __call__(self, inputs, offset, cache, **options):
        self.calls += 1
        if self.fails(self.calls, inputs):
            raise RuntimeError("injected fault")
        return self.model(inputs, offset, cache, **options)


def test_failed_decode_forward_fails_its_requests_and_the_run_goes_on(small):
    """The second one-token-per-row forward fails: the requests in it fail, and the
    requests that arrive later run as if nothing had happened."""
    decodes = 0

    def second_decode(calls, inputs):
        nonlocal decodes
        decodes += inputs.shape[1] == 1
        return inputs.shape[1] == 1 and decodes == 2

    rng = np.random.default_rng(1)
    first = [rng.integers(3, 211, n).tolist() for n in (5, 8)]
    late = [tiny.PromptSpec(ids, arrival_step=6) for ids in small.good]
    results = tiny.batch_generate(
        FaultyModel(small.model, second_decode),
        small.tokenizer,
        first + late,
        batch_size=2,
        prefill_step=None,
        max_seq_len=64,
        max_tokens=MAX_TOKENS,
    )
    assert_failed(results[0], "injected fault")
    for result, ids in zip(results[:2], first):
        if result.error is None:
            expected, _ = mlx_lm_greedy(small.reference, ids, MAX_TOKENS, [])
            assert result.tokens == expected[: len(result.tokens)]
        else:
            assert_failed(result, "injected fault")
    for result, expected in zip(results[2:], small.expected):
        assert result.error is None
        assert result.tokens == expected


def test_failed_prefill_fails_its_request_alone(small):
    ids = small.good[0] * 2 + [9]  # 13 tokens: no other prompt has that length
    faulty = FaultyModel(small.model, lambda calls, inputs: inputs.shape[1] == 13)
    prompts = [small.good[0], ids, small.good[1]]
    results = tiny.batch_generate(
        faulty,
        small.tokenizer,
        prompts,
        batch_size=2,
        prefill_step=None,
        max_seq_len=64,
        max_tokens=MAX_TOKENS,
    )
    assert_failed(results[1], "injected fault")
    for result, expected in zip([results[0], results[2]], small.expected):
        assert result.error is None and result.tokens == expected


# --- arguments of batch_generate ------------------------------------------------------


@pytest.mark.parametrize(
    "argument, value, error",
    [
        ("batch_size", 2.0, TypeError),
        ("batch_size", True, TypeError),
        ("batch_size", "4", TypeError),
        ("max_seq_len", 64.0, TypeError),
        ("max_seq_len", None, TypeError),
        ("max_tokens", 2.5, TypeError),
        ("max_tokens", 0, ValueError),
        ("prefill_step", 0.5, TypeError),
        ("prefill_step", "64", TypeError),
        ("prefill_step", 0, ValueError),
        ("sampler", 5, TypeError),
        ("on_step", "print", TypeError),
        ("reserved_interactive_slots", 1.0, TypeError),
        ("reserved_interactive_slots", 2, ValueError),
    ],
    ids=lambda v: repr(v) if not isinstance(v, type) else v.__name__,
)
def test_bad_argument_raises_naming_it(small, argument, value, error):
    with pytest.raises(error, match=argument):
        small.call(**{"batch_size": 2, argument: value})


@pytest.mark.parametrize(
    "arrival_step, error", [(1.5, TypeError), (-1, ValueError)], ids=["1.5", "-1"]
)
def test_bad_arrival_step_raises_instead_of_hanging(small, arrival_step, error):
    specs = [small.good[0], tiny.PromptSpec(small.good[1], arrival_step=arrival_step)]
    with pytest.raises(error, match="arrival_step"):
        small.call(specs)


def test_a_bare_string_as_prompts_raises(small):
    with pytest.raises(TypeError, match=r"\[prompt\]"):
        small.call("What is the capital of France?")


def test_a_bare_list_of_ids_as_prompts_raises(small):
    with pytest.raises(TypeError, match=r"\[token_ids\]"):
        small.call(small.good[0])


def test_bad_per_prompt_max_tokens_fails_alone(small):
    bad = small.run(tiny.PromptSpec(small.good[0], max_tokens=2.5))
    assert_failed(bad, "max_tokens", "2.5")


# --- context length -------------------------------------------------------------------


def test_prompt_plus_max_tokens_beyond_the_context_fails_alone(embedded):
    """8000 prompt tokens and max_tokens=500 pass SmolLM2's 8192 positions; the
    batch cache is sized by what is used, so max_seq_len=8192 costs nothing."""
    long = np.random.default_rng(2).integers(3, 49152, 8000).tolist()
    bad = embedded.run(tiny.PromptSpec(long, max_tokens=500), max_seq_len=8192)
    assert_failed(bad, "8000", "500", "8192")
    assert bad.tokens == []


def test_prompt_longer_than_the_context_fails_alone(embedded):
    long = np.random.default_rng(3).integers(3, 49152, 9000).tolist()
    bad = embedded.run(long, max_seq_len=8192)
    assert_failed(bad, "9000", "8192")


def test_max_seq_len_beyond_the_context_is_refused(embedded):
    with pytest.raises(ValueError, match="max_seq_len") as raised:
        embedded.call(max_seq_len=30000)
    assert "30000" in str(raised.value) and "8192" in str(raised.value)


def test_max_seq_len_beyond_a_default_context_is_refused(small):
    """A llama config without max_position_embeddings gets DEFAULT_MAX_SEQ_LEN."""
    reference = random_model(*SIZES[2], seed=2)
    assert reference.args.max_position_embeddings is None
    model = tiny.Qwen2ModelWeek2(reference, weights="float32")
    too_long = DEFAULT_MAX_SEQ_LEN + 1
    with pytest.raises(ValueError, match=str(DEFAULT_MAX_SEQ_LEN)):
        tiny.batch_generate(model, small.tokenizer, small.good, max_seq_len=too_long)


def test_a_short_context_bounds_prompt_plus_max_tokens(small):
    """A model trained for 16 positions and an 11-token prompt: every token but the
    last generated one takes a position, so max_tokens 6 fits and 7 does not; with
    no max_tokens, generation stops once the cache holds all 16 positions."""
    reference = random_model(*SIZES[0], seed=0)
    reference.args.max_position_embeddings = 16
    model = tiny.Qwen2ModelWeek2(reference, weights="float32")
    eos = mx.array([i in small.tokenizer.eos_token_ids for i in range(211)])
    ids = small.good[1]
    assert len(ids) == 11
    results = tiny.batch_generate(
        model,
        small.tokenizer,
        [tiny.PromptSpec(ids, max_tokens=n) for n in (6, 7, None)],
        prefill_step=None,
        max_seq_len=16,
        sampler=lambda logprobs: mx.argmax(mx.where(eos, -mx.inf, logprobs), axis=-1),
    )
    fits, too_long, open_ended = results
    assert fits.finish_reason == "length" and len(fits.tokens) == 6
    assert_failed(too_long, "11", "7", "17", "16")
    assert open_ended.finish_reason == "max_seq_len"
    assert open_ended.tokens == fits.tokens


# --- the cache is sized to what is used -----------------------------------------------


def test_a_large_batch_size_costs_no_memory_for_unused_slots(small):
    """2 prompts at batch_size 64 and at 2: the same tokens and the same peak memory
    (a cache preallocated for 64 rows of max_seq_len would hold 32x more)."""
    runs = {
        batch_size: small.call(batch_size=batch_size, max_seq_len=4096)
        for batch_size in (2, 64)
    }
    for results in runs.values():
        assert [r.tokens for r in results] == small.expected
    # 64 rows x 2 layers x keys and values x 2 heads x 4096 positions x 16 x 4 bytes.
    preallocated = 64 * 2 * 2 * 2 * 4096 * 16 * 4
    growth = runs[64].metrics.peak_memory_bytes - runs[2].metrics.peak_memory_bytes
    assert growth < preallocated / 16
