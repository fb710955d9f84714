"""Week 2 Day 6: an interrupt inside Engine.step() (Ctrl-C in a notebook, a sampler
that calls sys.exit) gets through to the caller, yet leaves the engine usable: the
requests of the interrupted forward fail saying so, and no cache is left out of step
with its request's position."""

from .interrupts import INTERRUPTS, check_interrupted_run
from .solution import tiny


@INTERRUPTS
def test_an_interrupted_step_leaves_the_dense_engine_usable(
    pair, tokenizer, no_eos, interrupt
):
    engine = tiny.Engine(pair[1], tokenizer, batch_size=2, prefill_step=4)
    check_interrupted_run(engine, pair, tokenizer, no_eos, interrupt, seed=11)
