"""The sampling fields of a request body beyond temperature, top_p and top_k, as
pydantic mixins: n, seed, the penalties, logit_bias, min_p, min_tokens,
ignore_eos (both endpoints), and log-probabilities, which each endpoint asks for in
its own words (chat: logprobs true and top_logprobs; completions: logprobs as a
count, and echo).

They become one tiny_llm_base.SamplingOptions (sampling_options()), which the
engine's requests act on; its docstring says what each option does and in which
order. A value out of range is a 400 naming the field; a token id outside the
model's vocabulary in logit_bias is refused once the vocabulary is known
(generation.py).
"""

from typing import Annotated

from pydantic import AfterValidator, PlainValidator, model_validator

from tiny_llm_base import MAX_LOGPROBS, SamplingOptions

from .errors import short
from .validation import Refusal, RequestModel, expect, is_int, number_in

MAX_CHOICES = 16  # n: each choice holds a decode slot of its own
MAX_COMPLETION_LOGPROBS = 5  # OpenAI's limit for /v1/completions' logprobs
MAX_SEED = 2**64  # a seed is any integer in [-2**63, 2**64)


def int_in(low: int, high: int | None, hint: str = ""):
    """An AfterValidator: an integer (already type-checked) in [low, high]."""

    def check(value: int | None) -> int | None:
        if value is not None and (value < low or (high is not None and value > high)):
            limit = f"at least {low}" if high is None else f"in [{low}, {high}]"
            raise Refusal(f"must be {limit}, got {short(value)}{hint}")
        return value

    return AfterValidator(check)


def seed_value(seed) -> int | None:
    if seed is None:
        return None
    if not is_int(seed):
        raise Refusal(f"must be an integer, got {short(seed)}", "invalid_type")
    if not -(2**63) <= seed < MAX_SEED:
        raise Refusal(f"must be in [-2**63, 2**64), got {short(seed)}")
    return seed


def bias_map(bias) -> dict[int, float] | None:
    """OpenAI's logit_bias: {"token id": bias}, a bias in [-100, 100]."""
    if bias is None:
        return None
    if not isinstance(bias, dict):
        raise Refusal(
            'must be an object of token ids and biases, such as {"50256": -100}',
            "invalid_type",
        )
    biases = {}
    for key, value in bias.items():
        token = key.strip() if isinstance(key, str) else ""
        if not token.isdigit():
            raise Refusal(
                f"has the key {short(key)}: keys are token ids, such as "
                '"50256" (the ids the model\'s tokenizer gives)'
            )
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise Refusal(f"must be a number, got {short(value)}", at=f"[{key!r}]")
        if not -100 <= value <= 100:
            raise Refusal(
                f"must be in [-100, 100], got {short(value)}", at=f"[{key!r}]"
            )
        biases[int(token)] = float(value)
    return biases


def positive_number(value) -> float:
    """repetition_penalty: a number > 0, 1 when left out."""
    if value is None:
        return 1.0
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise Refusal(f"must be a number, got {short(value)}", "invalid_type")
    if not 0 < value < float("inf"):
        raise Refusal(f"must be a number > 0 (1: no penalty), got {short(value)}")
    return float(value)


class SamplingFields(RequestModel):
    """The fields both endpoints share. A subclass says how it asks for
    log-probabilities (logprob_counts)."""

    n: Annotated[
        int | None,
        expect("an integer"),
        int_in(1, MAX_CHOICES, ": each choice takes a decode slot; ask for fewer"),
    ] = None
    seed: Annotated[int | None, PlainValidator(seed_value)] = None
    frequency_penalty: Annotated[float, number_in(-2.0, 2.0, 0.0)] = None
    presence_penalty: Annotated[float, number_in(-2.0, 2.0, 0.0)] = None
    repetition_penalty: Annotated[float, PlainValidator(positive_number)] = None
    logit_bias: Annotated[dict[int, float] | None, PlainValidator(bias_map)] = None
    min_p: Annotated[float, number_in(0.0, 1.0, 0.0)] = None
    min_tokens: Annotated[int | None, expect("an integer"), int_in(0, None)] = None
    ignore_eos: Annotated[bool | None, expect("true or false")] = None

    def logprob_counts(self) -> tuple[int | None, int | None]:
        """(top logprobs per generated token, per prompt token); None: not asked."""
        return None, None

    def sampling_options(self) -> SamplingOptions | None:
        """The engine's SamplingOptions, or None when nothing is asked."""
        logprobs, prompt_logprobs = self.logprob_counts()
        options = SamplingOptions(
            seed=self.seed,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            frequency_penalty=self.frequency_penalty,
            presence_penalty=self.presence_penalty,
            repetition_penalty=self.repetition_penalty,
            logit_bias=self.logit_bias or None,
            min_p=self.min_p,
            min_tokens=self.min_tokens or 0,
            ignore_eos=bool(self.ignore_eos),
        )
        return None if options == SamplingOptions() else options

    def check_lengths(self, max_tokens: int | None, constraint_param: str | None):
        """min_tokens within max_tokens; neither min_tokens nor ignore_eos beside a
        constraint, which decides where its answer ends (it would end at EOS)."""
        if self.min_tokens and max_tokens is not None and self.min_tokens > max_tokens:
            raise Refusal(
                f"is {self.min_tokens}, more than max_tokens ({max_tokens})",
                field="min_tokens",
            )
        for name in ("min_tokens", "ignore_eos"):
            if getattr(self, name) and constraint_param is not None:
                raise Refusal(
                    f"cannot be combined with {constraint_param}: the constraint "
                    "decides where the answer ends",
                    field=name,
                )


class ChatLogprobFields(RequestModel):
    """Chat's log-probabilities: logprobs true, and top_logprobs (0 to 20) most
    likely tokens at each position."""

    logprobs: Annotated[bool | None, expect("true or false")] = None
    top_logprobs: Annotated[
        int | None, expect("an integer"), int_in(0, MAX_LOGPROBS)
    ] = None

    @model_validator(mode="after")
    def logprobs_asked(self) -> "ChatLogprobFields":
        if self.top_logprobs is not None and not self.logprobs:
            raise Refusal(
                'needs "logprobs": true (it says how many of the most likely '
                "tokens to return beside each token's own)",
                field="top_logprobs",
            )
        return self

    def logprob_counts(self) -> tuple[int | None, int | None]:
        return (self.top_logprobs or 0) if self.logprobs else None, None


class CompletionLogprobFields(RequestModel):
    """Completions' log-probabilities: logprobs, a count (0 to 5) of the most
    likely tokens at each position; echo, the prompt before the answer, with its
    tokens' logprobs when logprobs is given (the first token's is null)."""

    logprobs: Annotated[
        int | None, expect("an integer"), int_in(0, MAX_COMPLETION_LOGPROBS)
    ] = None
    echo: Annotated[bool | None, expect("true or false")] = None

    def logprob_counts(self) -> tuple[int | None, int | None]:
        return self.logprobs, self.logprobs if self.echo else None
