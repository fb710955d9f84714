"""Week 2 Day 6, task 2: the planner's slots and queue, driven by hand.

No policy and no engine yet: the test plays the engine, prefilling the requests the
planner offers (prefill_candidates), placing the prefilled ones in slots
(place_prefilled) and retiring the finished (retire_finished), and checks the
slots, the queue and the decode rows after each move.
"""

import numpy as np
import pytest

from tiny_llm_base import EngineConfig

from .solution import tiny

pytestmark = pytest.mark.task(2)


def make_requests(model, tokenizer, sampler, vocab, count, priority="batch"):
    rng = np.random.default_rng(0)
    return [
        tiny.Request(
            model,
            tokenizer,
            rng.integers(3, vocab, 5 + i).tolist(),
            sampler=sampler,
            priority=priority,
        )
        for i in range(count)
    ]


@pytest.fixture
def setup(pair, tokenizer, no_eos):
    mlx_model, model = pair
    config = EngineConfig(batch_size=2, max_seq_len=64)
    planner = tiny.Planner(config, tiny.DenseKvManager(model, config))
    vocab = mlx_model.args.vocab_size
    return planner, model, tokenizer, no_eos[0], vocab


def test_requests_fill_the_slots_lowest_first_and_wait_for_a_free_one(setup):
    planner, model, tokenizer, sampler, vocab = setup
    a, b, c = make_requests(model, tokenizer, sampler, vocab, 3)
    for request in (a, b, c):
        planner.add(request)
    assert planner.by_urgency() == [a, b, c], "same priority: the order added"
    assert planner.slots == [None, None] and planner.decode_rows() == []

    first = next(planner.prefill_candidates())
    assert first is a and a in planner.holding
    a.try_prefill()
    planner.place_prefilled()
    assert planner.slots == [a, None] and planner.waiting == [b, c]
    assert a.kv_cache is None, "the slot's row holds its cache now"
    assert planner.decoding() == [(0, a)] and planner.decode_rows() == [a]

    # b may start: slot 1 will be free when its prefill ends. c may not start
    # while b is prefilled and waiting: there would be no slot for it.
    b.try_prefill()
    assert planner.slot_for(c) is None
    assert list(planner.prefill_candidates()) == []
    planner.place_prefilled()
    assert planner.slots == [a, b] and planner.waiting == [c]

    tokens, offsets = tiny.Plan(rows=planner.decode_rows()).decode_inputs()
    assert tokens == [a.next_token, b.next_token]
    assert offsets == [a.offset, b.offset]


def test_a_finished_request_frees_its_slot_for_the_next(setup):
    planner, model, tokenizer, sampler, vocab = setup
    a, b, c = make_requests(model, tokenizer, sampler, vocab, 3)
    for request in (a, b, c):
        planner.add(request)
    for _ in range(2):
        next(planner.prefill_candidates()).try_prefill()
        planner.place_prefilled()
    assert planner.slots == [a, b]
    a.finish("abort")
    planner.retire_finished()
    assert planner.slots == [None, b] and a not in planner.order
    assert a not in planner.holding
    tokens, offsets = tiny.Plan(rows=planner.decode_rows()).decode_inputs()
    assert tokens == [0, b.next_token] and offsets == [0, b.offset], (
        "an empty slot below a used one is a dummy row: token 0 at offset 0"
    )
    assert next(planner.prefill_candidates()) is c
    c.try_prefill()
    planner.place_prefilled()
    assert planner.slots == [c, b] and planner.waiting == []


def test_an_interactive_request_goes_first_within_the_batch_patience(setup):
    planner, model, tokenizer, sampler, vocab = setup
    (batch,) = make_requests(model, tokenizer, sampler, vocab, 1)
    (chat,) = make_requests(model, tokenizer, sampler, vocab, 1, "interactive")
    batch.metrics.arrival, chat.metrics.arrival = 0.0, 1.0
    planner.add(batch)
    planner.add(chat)
    assert planner.by_urgency() == [chat, batch]


def test_leaving_while_waiting_gives_the_memory_back(setup):
    planner, model, tokenizer, sampler, vocab = setup
    (a,) = make_requests(model, tokenizer, sampler, vocab, 1)
    planner.add(a)
    assert next(planner.prefill_candidates()) is a
    planner.leave(a)
    assert planner.waiting == [] and a not in planner.holding


def test_slot_for_leaves_the_lowest_free_slots_to_the_requests_ready_before_it(
    pair, tokenizer, no_eos
):
    mlx_model, model = pair
    sampler, vocab = no_eos[0], mlx_model.args.vocab_size
    # batch_slots = 4 - 1 = 3: batch requests together hold at most 3 slots.
    config = EngineConfig(batch_size=4, max_seq_len=64, reserved_interactive_slots=1)
    planner = tiny.Planner(config, tiny.DenseKvManager(model, config))
    a, b, c, e, g = make_requests(model, tokenizer, sampler, vocab, 5)
    d, f = make_requests(model, tokenizer, sampler, vocab, 2, "interactive")
    for request in (a, b, c):
        planner.add(request)
        next(planner.prefill_candidates()).try_prefill()
        planner.place_prefilled()
    b.finish("abort")
    planner.retire_finished()
    assert planner.slots == [a, None, c, None], "free slots: 1 and 3"
    for request in (d, e, f, g):
        planner.add(request)
    assert planner.slot_for(e) == 1, "nobody ready: the lowest free slot"

    # also_ready: their prefill ends this step, so each keeps a slot free, and a
    # batch one counts toward batch_slots (a and c hold 2, g makes 3).
    assert planner.slot_for(f, also_ready=[g]) == 3, "slot 1 is left to g"
    assert planner.slot_for(e, also_ready=[g]) is None, "batch requests hold 3"
    assert planner.slot_for(e, also_ready=[f, g]) is None, "two ready, two free"

    planner.admit(d)
    d.try_prefill()
    assert d.is_prefill_done and d in planner.waiting
    assert planner.slot_for(e) == 3, "slot 1 is left to d, prefilled and waiting"
    assert planner.slot_for(d) == 1, "a request does not leave a slot to itself"
    assert planner.slot_for(e, also_ready=[d]) == 3, "d counts once"
    assert planner.slot_for(e, also_ready=[g]) is None, "d and g take both"
