"""Week 2 Day 6: an interrupt inside Engine.step() (Ctrl-C in a notebook, a sampler
that calls sys.exit) gets through to the caller, yet leaves the engine usable: the
requests of the interrupted forward fail saying so, and no cache is left out of step
with its request's position; and a batch_size past the machine's memory is refused
before anything is made."""

import pytest

from .interrupts import INTERRUPTS, check_interrupted_run
from .solution import tiny

pytestmark = pytest.mark.task(4)


@INTERRUPTS
def test_an_interrupted_step_leaves_the_dense_engine_usable(
    pair, tokenizer, no_eos, interrupt
):
    engine = tiny.Engine(pair[1], tokenizer, batch_size=2, prefill_step=4)
    check_interrupted_run(engine, pair, tokenizer, no_eos, interrupt, seed=11)


def test_a_batch_size_past_the_machines_memory_is_refused_with_the_numbers(
    embedded_model,
):
    """Even at one position per slot, a billion slots cannot fit: refused before any
    per-slot bookkeeping is made (it raised MemoryError, or was killed)."""
    model = tiny.Qwen2ModelWeek2(embedded_model[0], weights="float32")
    with pytest.raises(ValueError, match=r"batch_size 1,000,000,000 .* GiB.*lower"):
        tiny.Engine(model, embedded_model[1], batch_size=10**9)
