"""What a request may ask of sampling beyond its sampler's temperature, top-k and
top-p: log-probabilities, a seed, OpenAI's and vLLM's penalties, logit biases,
min-p, a minimum length, or to ignore EOS. Given code: serving features, not a day's
lesson. A request carries a SamplingOptions and, once it starts, the state made
from it (start_sampling), which the request calls at three places:

    sample:  logits [1, V], the constraint's mask applied
               -> state.process(logits)       logprobs recorded; EOS ban, logit
                                               bias, then the penalties
               -> log-softmax -> state.draw(sampler, logprobs)
                                               min-p, then the sampler, with the
                                               request's own random key if seeded
    accept:  a kept token -> state.advance(token)     its logprob, its counts
    prefill: every prompt position's logits -> state.observe_prompt(logits, start)

The order is vLLM's: the structured-output mask first (a token it refuses stays at
-inf whatever a bias or a penalty adds), the logit bias and the EOS ban, then the
repetition, frequency and presence penalties, then temperature, min-p, top-k and
top-p (the sampler's own, inside draw). Log-probabilities are those of the logits
as the model gave them, the constraint's mask applied (vLLM's default,
"raw_logprobs"): before the bias, the penalties and the temperature, so they say
what the model thinks, not how the answer was drawn.

A request without options carries PlainSampling, whose calls change nothing and
cost nothing, so a plain request's step does no extra work. A request with options
never proposes speculative drafts: its penalties and logprobs go one token at a time.
"""

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import mlx.core as mx
import numpy as np

from .prompts import greedy, is_int

MAX_LOGPROBS = 20  # the most top_logprobs a position reports (OpenAI's chat limit)


@dataclass(frozen=True)
class TokenLogprob:
    """One position's log-probabilities. token: the token there (sampled, or the
    prompt's); logprob: its log-probability; top: the `k` most likely tokens and
    theirs, most likely first ((id, logprob) pairs; a token the constraint refuses,
    at -inf, is left out)."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class SamplingOptions:
    """A request's sampling options; the defaults ask for nothing.

    seed: draws with the request's own random key, mx.random.key(seed): the same
        seed gives the same tokens whatever else runs beside it. None: the shared
        random state. Needs a sampler whose distribution is known (make_sampler's,
        or greedy, where it changes nothing).
    logprobs: None, or k in 0 .. MAX_LOGPROBS: every generated token's
        log-probability and the k most likely tokens at its position.
    prompt_logprobs: the same for every prompt token but the first (which has no
        position before it: None). Its prompt is then never served from a prefix
        cache, whose positions have no logits.
    frequency_penalty, presence_penalty: in [-2, 2]; OpenAI's: a token's logit
        minus frequency_penalty x its count in the answer so far, minus
        presence_penalty if it appears at all.
    repetition_penalty: > 0 (1: none); vLLM's and Hugging Face's: a token seen in
        the prompt or the answer has its logit divided by it when positive,
        multiplied by it when not.
    logit_bias: {token id: a number in [-100, 100]} added to those tokens' logits.
    min_p: in [0, 1]: after temperature, tokens less likely than min_p x the most
        likely token's probability are dropped (0: none).
    min_tokens: EOS cannot be sampled before this many tokens are generated.
    ignore_eos: EOS is never sampled: the answer runs to max_tokens.
    Beside a constraint, min_tokens and ignore_eos may leave no token allowed
    where the constraint wants EOS (the server refuses the combination).
    """

    seed: int | None = None
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: Mapping[int, float] | None = None
    min_p: float = 0.0
    min_tokens: int = 0
    ignore_eos: bool = False

    def check(self, vocab_size: int) -> None:
        """TypeError or ValueError naming the first bad option."""
        if self.seed is not None and not is_int(self.seed):
            raise TypeError(f"seed must be an int or None, got {self.seed!r}")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and (
                not is_int(value) or not 0 <= value <= MAX_LOGPROBS
            ):
                raise ValueError(
                    f"{name} must be None or an int in [0, {MAX_LOGPROBS}], got "
                    f"{value!r}"
                )
        for name in ("frequency_penalty", "presence_penalty"):
            number_in(name, getattr(self, name), -2.0, 2.0)
        penalty = self.repetition_penalty
        if not is_number(penalty) or not 0 < penalty < math.inf:
            raise ValueError(
                f"repetition_penalty must be a number > 0 (1: none), got {penalty!r}"
            )
        number_in("min_p", self.min_p, 0.0, 1.0)
        if not is_int(self.min_tokens) or self.min_tokens < 0:
            raise ValueError(f"min_tokens must be an int >= 0, got {self.min_tokens!r}")
        if not isinstance(self.ignore_eos, bool):
            raise TypeError(
                f"ignore_eos must be True or False, got {self.ignore_eos!r}"
            )
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, Mapping):
                raise TypeError("logit_bias must be a {token id: bias} mapping")
            for token, bias in self.logit_bias.items():
                if not is_int(token) or not 0 <= token < vocab_size:
                    raise ValueError(
                        f"logit_bias has token id {token!r}, outside the model's "
                        f"vocabulary [0, {vocab_size})"
                    )
                number_in(f"logit_bias[{token}]", bias, -100.0, 100.0)


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def number_in(name: str, value, low: float, high: float) -> None:
    if not is_number(value) or not low <= value <= high:
        raise ValueError(
            f"{name} must be a number in [{low:g}, {high:g}], got {value!r}"
        )


def for_choice(options: SamplingOptions | None, index: int) -> SamplingOptions | None:
    """The options of choice `index` of a prompt asked n times (vLLM's rule): seed
    + index, so the choices differ but each is reproducible; the prompt's logprobs
    only for choice 0 (the choices share the prompt)."""
    if options is None or index == 0:
        return options
    seed = None if options.seed is None else options.seed + index
    return replace(options, seed=seed, prompt_logprobs=None)


def sampler_temperature(sampler) -> float | None:
    """0 for greedy, a TokenSampler's temp, None for a sampler that does not say."""
    if sampler is greedy:
        return 0.0
    temp = getattr(sampler, "temp", None)
    return float(temp) if is_number(temp) else None


class PlainSampling:
    """The state of a request that asks for no option: every call leaves things as
    they are, so the request samples exactly as without it. reads_each_token:
    False, nothing it does depends on the tokens sampled (a SamplingState's
    penalties and seeds do: True)."""

    allows_drafts = True
    reads_each_token = False
    wants_prompt_logprobs = False
    logprobs: Sequence[TokenLogprob] = ()
    prompt_logprobs = None

    def process(self, logits: mx.array) -> mx.array:
        return logits

    def draw(self, sampler, logprobs: mx.array) -> mx.array:
        return sampler(logprobs)

    def advance(self, token: int) -> None:
        pass

    def observe_prompt(self, logits: mx.array, start: int) -> None:
        pass


def start_sampling(
    options: SamplingOptions | None,
    prompt: list[int],
    sampler,
    eos_ids,
    vocab_size: int,
):
    """The state a request samples through: PlainSampling when `options` is None or
    asks for nothing, else a SamplingState. Raises TypeError or ValueError for a
    bad option (the request then fails alone)."""
    if options is None or options == SamplingOptions():
        return PlainSampling()
    if not isinstance(options, SamplingOptions):
        raise TypeError(
            f"options must be a SamplingOptions or None, got {type(options).__name__}"
        )
    options.check(vocab_size)
    return SamplingState(options, prompt, sampler, eos_ids, vocab_size)


class SamplingState:
    """One request's options at work (see the module's docstring for when each
    method is called).

    logprobs: a TokenLogprob per kept token, when options.logprobs is set.
    prompt_logprobs: when options.prompt_logprobs is set, one entry per prompt
        position observed so far, None first; complete once the prefill is done.
    reads_each_token: True, its penalties and seeds read every token sampled.
    """

    allows_drafts = False
    reads_each_token = True

    def __init__(
        self, options: SamplingOptions, prompt: list[int], sampler, eos_ids, vocab
    ):
        self.options = options
        self.prompt = list(prompt)
        self.temp = sampler_temperature(sampler)
        if self.temp is None and (options.seed is not None or options.min_p > 0):
            raise TypeError(
                "seed and min_p need a sampler whose distribution is known: "
                "make_sampler's (a TokenSampler) or greedy"
            )
        self.key = None if options.seed is None else mx.random.key(options.seed % 2**64)
        self.generated = 0
        self.pending: mx.array | None = None  # the logits process() saw last
        self.logprobs: list[TokenLogprob] = []
        self.wants_prompt_logprobs = options.prompt_logprobs is not None
        self.prompt_logprobs = [None] if self.wants_prompt_logprobs else None
        self.bias = None
        if options.logit_bias:
            bias = np.zeros(vocab, np.float32)
            for token, value in options.logit_bias.items():
                bias[token] = value
            self.bias = mx.array(bias)
        self.eos = None
        if options.ignore_eos or options.min_tokens > 0:
            mask = np.zeros(vocab, bool)
            mask[[t for t in eos_ids if 0 <= t < vocab]] = True
            self.eos = mx.array(mask)
        self.seen = None  # prompt and answer tokens, for the repetition penalty
        if options.repetition_penalty != 1:
            self.seen = np.zeros(vocab, bool)
            self.seen[self.prompt] = True
        self.counts = None  # each token's count in the answer, for the others
        if options.frequency_penalty or options.presence_penalty:
            self.counts = np.zeros(vocab, np.float32)

    def process(self, logits: mx.array) -> mx.array:
        """logits [1, V] (masked) -> logits [1, V] with the bias, the EOS ban and
        the penalties; the log-probabilities are kept for advance()."""
        options = self.options
        if options.logprobs is not None:
            self.pending = logits
        if self.bias is not None:
            logits = logits + self.bias
        if self.eos is not None and (
            options.ignore_eos or self.generated < options.min_tokens
        ):
            logits = mx.where(self.eos, -mx.inf, logits)
        if self.seen is not None:
            penalty = options.repetition_penalty
            scaled = mx.where(logits > 0, logits / penalty, logits * penalty)
            logits = mx.where(mx.array(self.seen), scaled, logits)
        if self.counts is not None:
            counts = self.counts
            penalties = options.frequency_penalty * counts
            penalties += options.presence_penalty * (counts > 0)
            logits = logits - mx.array(penalties.astype(np.float32))
        return logits

    def draw(self, sampler, logprobs: mx.array) -> mx.array:
        """logprobs [1, V] -> token [1]: min-p (at the sampler's temperature), then
        the sampler, or, with a seed, a draw from the sampler's distribution
        (sampler.logits) with the next key of the request's own."""
        if self.temp == 0:  # greedy: min-p keeps the top token, and nothing is drawn
            return sampler(logprobs)
        if self.options.min_p > 0:
            logprobs = keep_min_p(logprobs, self.options.min_p, self.temp)
        if self.key is None:
            return sampler(logprobs)
        self.key, key = mx.random.split(self.key)
        return mx.random.categorical(sampler.logits(logprobs), key=key)

    def advance(self, token: int) -> None:
        """A kept token: its logprob (from the logits process() saw last) and its
        counts."""
        self.generated += 1
        if self.pending is not None:
            [entry] = token_logprobs(self.pending, [token], self.options.logprobs)
            self.logprobs.append(entry)
            self.pending = None
        if self.counts is not None:
            self.counts[token] += 1
        if self.seen is not None:
            self.seen[token] = True

    def observe_prompt(self, logits: mx.array, start: int) -> None:
        """logits [L, V] at positions start .. start + L - 1, each predicting the
        next position's token: the prompt positions among those not recorded yet
        get their TokenLogprob (a restart's second prefill, or its generated
        tokens, add nothing). ValueError if positions were skipped (a prefix cache
        served them): their logprobs would be missing."""
        first = len(self.prompt_logprobs or ())  # the next position to record
        if not self.wants_prompt_logprobs or first == len(self.prompt):
            return
        if first <= start:
            raise ValueError(
                f"prompt logprobs: positions {first}..{start} have no logits (a "
                "prefix cache served them)"
            )
        last = min(start + logits.shape[0], len(self.prompt) - 1)
        if first > last:
            return
        rows = logits[first - start - 1 : last - start]
        self.prompt_logprobs += token_logprobs(
            rows, self.prompt[first : last + 1], self.options.prompt_logprobs
        )


def keep_min_p(logprobs: mx.array, min_p: float, temp: float) -> mx.array:
    """logprobs [1, V]; -inf for every token whose probability at temperature
    `temp` is below min_p x the most likely one's: (l - l_max) / temp < log(min_p)."""
    floor = mx.max(logprobs, axis=-1, keepdims=True) + temp * math.log(min_p)
    return mx.where(logprobs >= floor, logprobs, -mx.inf)


def token_logprobs(logits: mx.array, tokens: list[int], k: int) -> list[TokenLogprob]:
    """logits [R, V] (or log-probabilities) and one token per row -> each row's
    TokenLogprob: the token's log-probability and the row's k most likely."""
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    chosen = mx.take_along_axis(logprobs, mx.array(tokens)[:, None], axis=-1)
    tops = [[] for _ in tokens]
    if k:
        ids = mx.argpartition(-logprobs, kth=k - 1, axis=-1)[:, :k]
        values = mx.take_along_axis(logprobs, ids, axis=-1)
        order = mx.argsort(-values, axis=-1)
        ids = mx.take_along_axis(ids, order, axis=-1).tolist()
        values = mx.take_along_axis(values, order, axis=-1).tolist()
        tops = [
            [(i, v) for i, v in zip(row_ids, row_values) if v > -math.inf]
            for row_ids, row_values in zip(ids, values)
        ]
    return [
        TokenLogprob(token, value, tuple(top))
        for token, value, top in zip(tokens, chosen[:, 0].tolist(), tops)
    ]
