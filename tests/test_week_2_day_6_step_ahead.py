"""Week 2 Day 6 (given code): the engine's decode forwards started a step ahead
(step_ahead.StepAheadRunner) give the tokens of mlx-lm's greedy generation of each
prompt alone, as the plain ModelRunner does, through staggered finishes, a request
that arrives while the others decode (its row fits no forward started ahead), an
abort, and the dense cache (the paged one: week 3 day 2's tests); and a steady decode really runs ahead."""

import numpy as np
import pytest

from tiny_llm_base import PromptSpec, greedy
from tiny_llm_base.mlx_lm_reference import mlx_lm_greedy

from .solution import tiny

pytestmark = pytest.mark.task(4)


def prompts(vocab: int) -> list[list[int]]:
    rng = np.random.default_rng(3)
    return [rng.integers(3, vocab, n).tolist() for n in (5, 9, 3, 12)]


def engine(pair, tokenizer, kv_cache: str, **settings):
    settings = dict(batch_size=4, max_seq_len=64, prefill_step=None) | settings
    settings.setdefault("step_ahead", True)
    if kv_cache == "paged":
        settings.update(
            kv_cache="paged", block_size=4, num_blocks=64, prefix_caching=False
        )
    return tiny.Engine(pair[1], tokenizer, **settings)


def drain(engine) -> dict[int, object]:
    results = {}
    while engine.has_unfinished():
        for output in engine.step():
            if output.result is not None:
                results[output.request_id] = output.result
    return results


def test_tokens_equal_mlx_lm_through_finishes_arrivals_and_an_abort(
    pair, tokenizer, no_eos
):
    check_tokens(pair, tokenizer, no_eos, "dense")


def check_tokens(pair, tokenizer, no_eos, kv_cache: str, **settings) -> list[bool]:
    """The first test's checks on a dense or (week 3 day 2) paged cache, with the
    engine `settings` (week 3 day 1: the mixed policy). Returns, per step, whether
    it ran prefill chunks while a forward ran ahead."""
    sampler, banned = no_eos
    mlx_model, _ = pair
    texts = prompts(mlx_model.args.vocab_size)
    lengths = [7, 12, 4, 9]
    chunked = []
    settings["on_forward"] = lambda record: chunked.append(bool(record.chunks))
    run = engine(pair, tokenizer, kv_cache, **settings)
    ids = [
        run.add_request(PromptSpec(p, max_tokens=n, sampler=sampler))
        for p, n in zip(texts[:3], lengths)
    ]
    ran_ahead = []
    aborted = run.add_request(PromptSpec(texts[0], max_tokens=30, sampler=sampler))
    results, chunks_beside_ahead = {}, []
    for step in range(200):
        chunked.clear()
        pending = run.runner.ahead is not None
        for output in run.step():
            if output.result is not None:
                results[output.request_id] = output.result
        chunks_beside_ahead.append(pending and any(chunked))
        ran_ahead.append(run.runner.ahead is not None)
        if step == 4:  # arrives while the others decode a step ahead
            ids.append(
                run.add_request(
                    PromptSpec(texts[3], max_tokens=lengths[3], sampler=sampler)
                )
            )
        if step == 6:
            run.abort(aborted)
        if not run.has_unfinished():
            break
    assert any(ran_ahead), "no decode step ran ahead"
    for request_id, prompt, n in zip(ids, texts, lengths):
        expected = mlx_lm_greedy(mlx_model, prompt, n, [], banned)[0]
        assert results[request_id].tokens == expected
        assert results[request_id].finish_reason == "length"
    assert results[aborted].finish_reason == "abort"
    assert 0 < len(results[aborted].tokens) < 30
    return chunks_beside_ahead


def test_eos_and_a_failing_sampler_land_as_without_the_step_ahead(pair, tokenizer):
    """Greedy with EOS allowed, and a sampler that raises on its 4th call: the same
    tokens, finish reasons and error as the plain ModelRunner's."""
    ahead = engine_results(pair, tokenizer, plain=False)
    assert ahead == engine_results(pair, tokenizer, plain=True)
    assert ahead[0][1] == "error" and "sampler broke" in ahead[0][2]


def engine_results(pair, tokenizer, plain: bool, **settings) -> list[tuple]:
    """(tokens, finish_reason, error) of each of the four prompts, the first with a
    sampler that raises on its 4th call, the others greedy with EOS allowed; the
    plain ModelRunner (step_ahead=False) or the step ahead."""
    texts = prompts(pair[0].args.vocab_size)
    calls = 0

    def breaks_on_4(logprobs):
        nonlocal calls
        calls += 1
        if calls == 4:
            raise RuntimeError("sampler broke")
        return greedy(logprobs)

    one = engine(pair, tokenizer, "dense", step_ahead=not plain, **settings)
    assert (type(one.runner) is tiny.ModelRunner) == plain
    one.add_request(PromptSpec(texts[0], max_tokens=12, sampler=breaks_on_4))
    for text in texts[1:]:
        one.add_request(PromptSpec(text, max_tokens=20))
    results = drain(one)
    return [(r.tokens, r.finish_reason, r.error) for _, r in sorted(results.items())]
