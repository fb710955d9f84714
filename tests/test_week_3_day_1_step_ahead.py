"""Week 3 Day 1 (given code): under the mixed policy the decode-only steps run a
step ahead too (step_ahead.StepAheadRunner.run_mixed) and give mlx-lm's tokens
(the checks of test_week_2_day_6_step_ahead); a request that takes a row freed by
an abort while a forward runs ahead prefills in a forward of its own beside it;
EOS and a failing sampler land as with the plain ModelRunner."""

import pytest

from .test_week_2_day_6_step_ahead import check_tokens, engine_results

pytestmark = pytest.mark.task(3)


def test_mixed_tokens_equal_mlx_lm_through_finishes_arrivals_and_an_abort(
    pair, tokenizer, no_eos
):
    chunks_beside_ahead = check_tokens(pair, tokenizer, no_eos, "dense", policy="mixed")
    assert any(chunks_beside_ahead), "no chunk ran while a forward ran ahead"


def test_mixed_eos_and_a_failing_sampler_land_as_without_the_step_ahead(
    pair, tokenizer
):
    ahead = engine_results(pair, tokenizer, plain=False, policy="mixed")
    assert ahead == engine_results(pair, tokenizer, plain=True, policy="mixed")
    assert ahead[0][1] == "error" and "sampler broke" in ahead[0][2]
