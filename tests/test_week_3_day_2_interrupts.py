"""Week 3 Day 2: an interrupt inside Engine.step() on the paged cache and the mixed
step leaves every block accounted for and the engine usable; a pool that could not
fit in memory is refused before anything is allocated."""

import numpy as np
import pytest

from .interrupts import INTERRUPTS, check_interrupted_run
from .paged_checks import assert_pool_empty
from .solution import tiny

pytestmark = pytest.mark.task(4)


@INTERRUPTS
@pytest.mark.parametrize("policy", ["alternate", "mixed"])
def test_an_interrupted_step_leaves_the_paged_engine_usable(
    pair, tokenizer, no_eos, interrupt, policy
):
    engine = tiny.Engine(
        pair[1],
        tokenizer,
        batch_size=2,
        prefill_step=4,
        policy=policy,
        kv_cache="paged",
        block_size=3,
        prefix_caching=False,
    )
    check_interrupted_run(engine, pair, tokenizer, no_eos, interrupt, seed=12)
    assert_pool_empty(engine)


@pytest.mark.parametrize(
    "settings",
    [
        {"block_size": 10**6, "num_blocks": 1},
        {"num_blocks": 10**9},
        {"kv_memory": "64TiB"},
    ],
    ids=["huge blocks", "huge pool", "huge budget"],
)
def test_a_pool_past_the_machines_memory_is_refused_with_the_numbers(
    embedded_model, settings
):
    model = tiny.Qwen2ModelWeek2(embedded_model[0], weights="float32")
    with pytest.raises(ValueError, match=r"KV pool of [\d,]+ positions needs .* GiB"):
        tiny.Engine(
            model, embedded_model[1], kv_cache="paged", max_seq_len=128, **settings
        )


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"kv_memory": "1MiB"}, r"kv_memory 1.0 MiB holds 16 tokens at 46,080 bytes"),
        ({"block_size": 10**6}, r"the default KV budget \(half the available memory"),
    ],
)
def test_a_budget_too_small_for_one_request_says_what_it_holds(
    embedded_model, settings, message
):
    """46,080 bytes a token: the embedded model's 30 layers x 3 KV heads x 64 x 2
    (keys and values) x 4 bytes (float32); 1 MiB holds one whole block of 16."""
    model = tiny.Qwen2ModelWeek2(embedded_model[0], weights="float32")
    with pytest.raises(ValueError, match=message + ".*max_seq_len"):
        tiny.Engine(
            model, embedded_model[1], kv_cache="paged", max_seq_len=128, **settings
        )


def test_a_pool_the_model_does_not_describe_is_checked_at_its_first_write(
    pair, tokenizer
):
    """A model wrapper that hides its layers: the request whose forward would make
    the pool fails with the numbers, and the engine goes on."""
    model = pair[1]

    class Wrapper:
        vocab_size, context_length = model.vocab_size, model.context_length
        create_kv_cache = model.create_kv_cache

        def __call__(self, *args, **kwargs):
            return model(*args, **kwargs)

    engine = tiny.Engine(
        Wrapper(),
        tokenizer,
        kv_cache="paged",
        prefix_caching=False,
        block_size=10**5,
        num_blocks=10**4,
        max_seq_len=64,
    )
    engine.add_request([1, 2, 3])
    results = [o.result for _ in range(3) for o in engine.step() if o.result]
    assert results and results[0].finish_reason == "error"
    assert "GiB" in results[0].error and "lower kv_memory" in results[0].error


def test_an_interrupt_between_staging_and_reading_leaves_nothing_staged(
    pair, tokenizer, no_eos
):
    """A KeyboardInterrupt in layer 0's attention, after the step's keys were staged
    and before they were read: the step still drops what was staged (written later,
    it could land on blocks that changed hands), and the next requests get mlx-lm's
    tokens."""
    from .helpers import assert_like_mlx_lm, token_ids
    from .paged_checks import run_engine

    mlx_model, model = pair
    sampler, banned = no_eos
    rng = np.random.default_rng(13)
    engine = tiny.Engine(
        model,
        tokenizer,
        batch_size=2,
        prefill_step=4,
        policy="mixed",
        kv_cache="paged",
        block_size=3,
        max_seq_len=64,
        max_tokens=5,
        sampler=sampler,
        prefix_caching=False,
    )
    attention = model.layers[0].attention
    rope = attention.apply_rope
    calls = []

    def interrupted(x, offset):  # the first call ropes the keys, the second q
        calls.append(x)
        if len(calls) == 2:
            staged.extend(list(layer.staged) for layer in engine.kv.layer_blocks[:1])
            raise KeyboardInterrupt
        return rope(x, offset)

    staged = []
    engine.add_request(token_ids(rng, mlx_model.args.vocab_size, 9))
    attention.apply_rope = interrupted
    try:
        with pytest.raises(KeyboardInterrupt):
            engine.step()
    finally:
        del attention.apply_rope
    assert staged and staged[0], "the interrupt came before anything was staged"
    assert all(layer.staged == [] for layer in engine.kv.layer_blocks)
    prompts = [token_ids(rng, mlx_model.args.vocab_size, n) for n in (7, 11)]
    results = run_engine(engine, prompts)
    assert_like_mlx_lm(results, mlx_model, prompts, 5, tokenizer, banned)
    assert_pool_empty(engine)
