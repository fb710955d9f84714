"""What the interrupt tests (week 2 day 6, week 3 day 2) share: a run in which one
request's sampler raises an interrupt (Ctrl-C in a notebook, sys.exit in a callback)
in the middle of a step."""

import numpy as np
import pytest

from .helpers import assert_same_tokens, expected_tokens, token_ids
from .solution import tiny


class InterruptOnCall:
    """A sampler that answers like `sampler` but raises `interrupt` on its n-th call."""

    def __init__(self, sampler, interrupt: type[BaseException], n: int):
        self.sampler, self.interrupt, self.calls, self.n = sampler, interrupt, 0, n

    def __call__(self, logprobs):
        self.calls += 1
        if self.calls == self.n:
            raise self.interrupt()
        return self.sampler(logprobs)


def step_through_interrupts(engine, max_steps: int = 500) -> tuple[dict, int]:
    """Step until nothing is left, catching interrupts: (results by id, interrupts
    seen)."""
    results, interrupts = {}, 0
    for _ in range(max_steps):
        if not engine.has_unfinished():
            return results, interrupts
        try:
            outputs = engine.step()
        except (KeyboardInterrupt, SystemExit):
            interrupts += 1
            continue
        results.update({o.request_id: o.result for o in outputs if o.result})
    raise AssertionError(f"not done after {max_steps} steps")


def check_interrupted_run(engine, pair, tokenizer, no_eos, interrupt, seed):
    """An interrupt raised inside step() gets through, the forward's requests fail
    saying so, every other request gets mlx-lm's tokens, and the engine then serves
    new requests correctly (no cache left out of step)."""
    mlx_model, _ = pair
    sampler, banned = no_eos
    vocab = mlx_model.args.vocab_size
    rng = np.random.default_rng(seed)
    prompts = [token_ids(rng, vocab, n) for n in (7, 12, 5)]
    specs = [tiny.PromptSpec(p, max_tokens=6, sampler=sampler) for p in prompts]
    specs[1].sampler = InterruptOnCall(sampler, interrupt, 3)
    ids = [engine.add_request(spec) for spec in specs]
    results, interrupts = step_through_interrupts(engine)
    assert interrupts == 1
    expected = expected_tokens(mlx_model, prompts, 6, tokenizer, banned)
    failed = [i for i in ids if results[i].finish_reason == "error"]
    assert ids[1] in failed
    for request_id, (tokens, gaps) in zip(ids, expected):
        result = results[request_id]
        if request_id in failed:
            assert f"interrupted by {interrupt.__name__}" in result.error
            tokens = tokens[: len(result.tokens)]
        else:
            assert result.finish_reason == "length", result.error
        assert_same_tokens(result.tokens, tokens, gaps, f"request {request_id}")
    later = [token_ids(rng, vocab, n) for n in (9, 4)]
    specs = [tiny.PromptSpec(p, max_tokens=5, sampler=sampler) for p in later]
    ids = [engine.add_request(spec) for spec in specs]
    results, interrupts = step_through_interrupts(engine)
    assert interrupts == 0
    for request_id, (tokens, gaps) in zip(
        ids, expected_tokens(mlx_model, later, 5, tokenizer, banned)
    ):
        assert results[request_id].finish_reason == "length", results[request_id].error
        assert_same_tokens(results[request_id].tokens, tokens, gaps, "after")
    assert engine.slots == (None,) * engine.config.batch_size
    assert engine.waiting == ()


INTERRUPTS = pytest.mark.parametrize("interrupt", [KeyboardInterrupt, SystemExit])
