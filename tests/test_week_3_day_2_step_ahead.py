"""Week 3 Day 2 (given code): decode forwards started a step ahead on the paged
cache give mlx-lm's tokens (the checks of test_week_2_day_6_step_ahead); a step
whose next position needs a new block runs synchronously, so a request still holds
blocks only for the tokens computed; the same under the mixed policy (week 3 day
1)."""

import pytest

from .test_week_2_day_6_step_ahead import check_tokens

pytestmark = pytest.mark.task(4)


def test_paged_tokens_equal_mlx_lm_through_finishes_arrivals_and_an_abort(
    pair, tokenizer, no_eos
):
    check_tokens(pair, tokenizer, no_eos, "paged")


def test_mixed_paged_tokens_equal_mlx_lm(pair, tokenizer, no_eos):
    check_tokens(pair, tokenizer, no_eos, "paged", policy="mixed")
