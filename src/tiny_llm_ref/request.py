"""One generation request, from its prompt to its finish reason.

The request keeps one token list, `tokens`: the prompt's ids, then each generated
token as it is accepted. Progress is counters over it: `offset` (tokens already in
the request's KV cache: prompt tokens while it prefills, then one more per decode
step) and `prefill_length` (the tokens a prefill computes: the prompt, or after a
restart everything so far). `prefill_tokens`, `generated`, `next_token` and
`is_prefill_done` are derived from them, never stored.
Prefill runs in chunks: each `try_prefill` call pushes at most `prefill_max_step`
prompt tokens through the model, starting at `offset`, and the last chunk samples
the first generated token. Every sampled token goes through `accept`, the one place
that decides whether the request is done.
A request checks itself when it is made: a bad prompt or setting fails it alone
(finish_reason "error") before it costs any compute, and so does anything that goes
wrong while it samples a token.
Settings a request only starts from are not kept: its clock, constraint and
options live on in metrics, constraint_state and sampling_state.
"""

import time
from collections.abc import Callable
from dataclasses import InitVar, dataclass, field

import mlx.core as mx

from tiny_llm_base import (
    GenerationResult,
    NoConstraint,
    PlainSampling,
    Sampler,
    SamplingOptions,
    check_int,
    greedy,
    request_prompt_ids,
    sampled_token_id,
    start_sampling,
)

from .constrained import ConstraintState, start_constraint
from .kv_cache import TinyKvCache
from .metrics import RequestMetrics


@dataclass
class DraftState:
    """A request's drafting (week 3 day 4; speculative.py moves it), as
    constraint_state and sampling_state are its constraint's and options'.

    acceptance: an average of the share of its draft tokens accepted (1.0 before
    any). resume_at: the count of generated tokens before which it proposes no
    drafts (a pause once they stopped paying). pauses: how many pauses it has had
    (each lasts twice the one before). hidden (week 4 day 3, with a draft head):
    the model's last-layer output [E] at the position its next_token was sampled
    from, which the head drafts from; None before its first.
    """

    acceptance: float = 1.0
    resume_at: int = 0
    pauses: int = 0
    hidden: mx.array | None = None


@dataclass
class PromptChoice:
    """Which of its prompt's n choices a request is (PromptSpec.n; choices.py makes
    them): index, 0 for the first; first, the first choice's Request for the others
    (None for it). The others wait for its prefill and share its prompt's blocks."""

    index: int = 0
    first: "Request | None" = None


@dataclass(eq=False)
class Request:
    """A prompt being prefilled (offset < prompt length), decoded, or finished.

    model: called as model(tokens [1, L], offset, kv_cache, last_position_only=True)
        -> logits [1, 1, V] for the chunk's last position (False: [1, L, V]);
        model.create_kv_cache() gives one cache per layer; model.vocab_size bounds
        the token ids, model.context_length the positions.
    tokenizer: its chat template (through prompt_token_ids), `detokenizer` and
        `eos_token_ids`.
    prompt: text or token ids (see prompt_token_ids), kept as given for result().
    prefill_max_step: try_prefill's chunk size when it is given none; None: the whole
        rest of the prompt.
    max_tokens, max_seq_len: finish with "length" after max_tokens generated tokens,
        with "max_seq_len" once offset reaches max_seq_len (None: max_tokens has no
        limit, max_seq_len becomes model.context_length). max_seq_len may not pass
        model.context_length.
    sampler: log-probabilities [1, V] -> token id [1]. priority: "batch" or
        "interactive". clock (not kept: it becomes metrics.clock): read once per
        accepted token (metrics.record_token).

    tokens: the prompt's token ids, then every generated token (an EOS is never
        kept); metrics.prompt_tokens says where the prompt ends.
    prefill_length: how many of `tokens` a prefill computes (prefill_tokens): the
        prompt's, then after a restart every token so far.
    offset: tokens in the request's KV cache, its next position. Only `advance`
        moves it forward (try_prefill by each chunk's length; the engine's model
        runner by what each forward fed; a prefix cache by the tokens it already
        holds), and only `restart` sets it back to 0.
    finish_reason: None while the request runs, then "stop", "length",
        "max_seq_len", "abort" (Engine.abort) or "error" (then `error` says why).
    metrics: the request's RequestMetrics, reading the clock given.
    detokenizer: tokenizer.detokenizer, fed every kept token; `text` reads it.
    kv_cache: the request's own cache (model.create_kv_cache()) while it prefills;
        None once a decode slot has copied it into the batch cache, or once finished.
    drafting (week 3 day 4): its DraftState.
    constraint (week 3 day 5; not kept): None, Regex(pattern), Choice(options),
        JsonSchema or JsonObject: the answer must match. constraint_state: its
        ConstraintState (start_constraint), which masks the logits in `sample` and advances in
        `accept`; without a constraint, NoConstraint() (tiny_llm_base), which
        allows everything, so both call it the same way. A bad constraint fails this
        request alone.
    options (not kept): None or a SamplingOptions (tiny_llm_base: logprobs, a
        seed, penalties, ...). sampling_state: start_sampling(options, prompt ids,
        sampler, tokenizer.eos_token_ids, model.vocab_size), given code with the
        same shape of calls as constraint_state: `sample` passes the masked logits
        through its process() and draws through its draw(), `accept` calls its
        advance(token), and a prefill that computes every position's logits (when
        its wants_prompt_logprobs) gives them to observe_prompt(logits, start).
        Without options it is PlainSampling(), whose calls change nothing. A bad
        option fails this request alone.
    choice: its PromptChoice, which of its prompt's n choices it is (index, and
        the first choice's Request for the others: they wait for its prefill and
        share its prompt's blocks).
    """

    model: object
    tokenizer: object
    prompt: str | list[int]
    prefill_max_step: int | None = 128
    max_tokens: int | None = None
    max_seq_len: int | None = None
    sampler: Sampler = greedy
    priority: str = "batch"
    clock: InitVar[Callable[[], float]] = time.perf_counter
    constraint: InitVar[object] = None
    options: InitVar[SamplingOptions | None] = None
    choice: PromptChoice = field(default_factory=PromptChoice)
    tokens: list[int] = field(init=False, default_factory=list)
    prefill_length: int = field(init=False, default=0)
    offset: int = field(init=False, default=0)
    finish_reason: str | None = field(init=False, default=None)
    error: str | None = field(init=False, default=None)
    metrics: RequestMetrics = field(init=False, default_factory=RequestMetrics)
    detokenizer: object = field(init=False, default=None)
    kv_cache: list[TinyKvCache] | None = field(init=False, default=None)
    drafting: DraftState = field(init=False, default_factory=DraftState)
    constraint_state: ConstraintState | NoConstraint = field(
        init=False, default_factory=NoConstraint
    )
    sampling_state: object = field(init=False, default_factory=PlainSampling)

    def __post_init__(
        self,
        clock: Callable[[], float],
        constraint: object,
        options: SamplingOptions | None,
    ) -> None:
        self.metrics.clock = clock
        check_int("prefill_max_step", self.prefill_max_step, 1, allow_none=True)
        context = self.model.context_length
        if self.max_seq_len is None:
            self.max_seq_len = context
        check_int("max_seq_len", self.max_seq_len, 1)
        if self.max_seq_len > context:
            raise ValueError(
                f"max_seq_len is {self.max_seq_len} but the model's context is "
                f"{context} positions: pass at most {context}"
            )
        try:
            settings = self.priority, self.max_tokens, self.sampler, self.max_seq_len
            ids = request_prompt_ids(self.model, self.tokenizer, self.prompt, *settings)
            if constraint is not None:
                vocab_size = self.model.vocab_size
                self.constraint_state = start_constraint(
                    constraint, self.tokenizer, vocab_size
                )
            self.sampling_state = start_sampling(
                options,
                ids,
                self.sampler,
                self.tokenizer.eos_token_ids,
                self.model.vocab_size,
            )
        except (TypeError, ValueError) as error:
            self.fail(str(error))
            return
        self.tokens = ids
        self.prefill_length = len(ids)
        self.kv_cache = self.model.create_kv_cache()
        self.detokenizer = self.tokenizer.detokenizer
        self.metrics.prompt_tokens = len(ids)

    @property
    def prefill_tokens(self) -> list[int]:
        """The tokens a prefill computes: tokens[:prefill_length]."""
        return self.tokens[: self.prefill_length]

    @property
    def generated(self) -> list[int]:
        """The generated tokens: tokens past the prompt (metrics.prompt_tokens)."""
        return self.tokens[self.metrics.prompt_tokens :]

    @property
    def next_token(self) -> int | None:
        """The token sampled last, not yet in any cache: the next decode step's
        input, tokens[-1] while the request decodes (prefill done, offset one short
        of its tokens). None before the first token, while it prefills again after
        a restart, and once finished."""
        # Week 2 Day 6 Task 1: next_token: tokens[-1] when not finished, the prefill is
        # done and offset is len(tokens) - 1; else None
        decoding = self.is_prefill_done and self.offset == len(self.tokens) - 1
        return self.tokens[-1] if decoding and not self.is_finished else None

    @property
    def is_prefill_done(self) -> bool:
        # Week 2 Day 6 Task 1: is_prefill_done: offset has reached prefill_length
        return self.offset >= self.prefill_length

    @property
    def is_finished(self) -> bool:
        # Week 2 Day 6 Task 1: is_finished: the request has a finish_reason
        return self.finish_reason is not None

    @property
    def text(self) -> str:
        return self.detokenizer.text if self.detokenizer else ""

    def try_prefill(self, max_step: int | None = None) -> int:
        """Prefill the next chunk; return how many prompt tokens it processed.

        The chunk is tokens[offset : offset + step] within prefill_length, step being
        `max_step`,
        else prefill_max_step (None: the whole rest). It runs through the model at
        `offset` with kv_cache (last_position_only, unless sampling_state
        wants_prompt_logprobs: then every position's logits go to its
        observe_prompt(logits [L, V], the chunk's offset)), its queries seeing the
        earlier chunks through the chunk mask, and offset advances by its length.
        The cache is evaluated here (mx.eval of every layer's keys and values), so
        the lazy graph never spans chunks. The last chunk samples the first token
        from its last position (logits[:, -1, :], [1, V]) and accepts it
        (sample_and_accept). Checked first: ValueError once the prefill is done
        ("prefill is already done: this request is decoding"); then TypeError or
        ValueError for a max_step that is not an int of at least 1 or None
        (check_int("max_step", ...)).
        """
        # Week 2 Day 6 Task 1: try_prefill: ValueError once prefill is done; run
        # tokens[offset : offset + step] (up to prefill_length) through the model at
        # `offset` with kv_cache (step: max_step, else prefill_max_step; None: the whole
        # rest; last_position_only=True unless sampling_state.wants_prompt_logprobs,
        # which then observe_prompt's every position), advance offset, mx.eval the
        # cache, and on the last chunk sample_and_accept the first token. Day 6 calls it
        # once per prompt, with the whole prompt; Day 7's tests call it chunk by chunk
        if self.is_prefill_done:
            raise ValueError("prefill is already done: this request is decoding")
        check_int("max_step", max_step, 1, allow_none=True)
        step = max_step if max_step is not None else self.prefill_max_step
        end = (
            self.prefill_length
            if step is None
            else min(self.offset + step, self.prefill_length)
        )
        chunk = mx.array([self.tokens[self.offset : end]])
        every = self.sampling_state.wants_prompt_logprobs
        start = self.offset
        logits = self.model(chunk, start, self.kv_cache, last_position_only=not every)
        processed = end - start
        self.advance(processed)
        if every:
            self.sampling_state.observe_prompt(logits[0], start)
        cache_state = [c.keys for c in self.kv_cache] + [
            c.values for c in self.kv_cache
        ]
        mx.eval(*cache_state)
        if self.is_prefill_done:
            self.sample_and_accept(logits[:, -1, :])
        return processed

    def advance(self, tokens: int) -> None:
        """`tokens` more of this request's tokens are in its KV cache now: the one
        place its position moves forward."""
        # Week 2 Day 6 Task 1: advance: offset += tokens
        self.offset += tokens

    def restart(self) -> None:
        """Start over (preemption): the KV cache was taken back, so the prompt and the
        tokens generated so far are prefilled again from position 0, and the
        prefill's last chunk samples the next token. Tokens already generated stay
        generated; the request's own cache is made anew when it is admitted again."""
        # Week 3 Day 1 Task 4: restart: prefill_length = every token so far; offset 0;
        # kv_cache None; metrics.preemptions += 1
        self.prefill_length = len(self.tokens)
        self.offset = 0
        self.kv_cache = None
        self.metrics.preemptions += 1

    def sample(self, logits: mx.array) -> object:
        """logits: [1, V] -> the sampler's answer, not read (lazy: a step-ahead
        runner starts the next forward on it before reading it). The constraint masks the logits, the sampling state processes them
        (penalties, biases: PlainSampling leaves them as they are), they become
        log-probabilities, and the sampling state draws the token through the
        sampler (sampling_state.draw(sampler, logprobs): PlainSampling just calls
        it).
        """
        logits = self.constraint_state.mask(logits)
        logits = self.sampling_state.process(logits)
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        return self.sampling_state.draw(self.sampler, logprobs)

    def sample_and_accept(self, logits: mx.array) -> None:
        """logits: [1, V] at the request's last position: sample and accept a token
        (accept_drawn of what sample answers, or of the exception it raised)."""
        # Week 2 Day 6 Task 1: sample_and_accept: accept_drawn(sample(logits)), or of
        # the exception sample raised
        try:
            drawn = self.sample(logits)
        except Exception as error:
            drawn = error
        self.accept_drawn(drawn)

    def accept_drawn(self, drawn: object) -> None:
        """Accept the sampler's answer `drawn` (read here: sampled_token_id). Whatever
        fails (an exception sample raised, passed as `drawn`; the answer; the
        detokenizer) fails this request alone, with a message naming the error."""
        try:
            if isinstance(drawn, Exception):
                raise drawn
            self.accept(sampled_token_id(drawn, self.model.vocab_size))
        except Exception as error:
            self.fail(
                f"sampling token {len(self.generated) + 1} failed: "
                f"{type(error).__name__}: {error}"
            )

    def accept(self, token: int) -> None:
        """Take a sampled token: finish on EOS, max_tokens, or a full cache.

        Its time is recorded first (metrics.record_token()), EOS included.
        EOS finishes with "stop" and is not kept. Any other token is kept: the
        constraint and sampling states advance over it, then it joins `tokens` (so
        it is next_token) and the detokenizer; then the request finishes with
        "length" once it has max_tokens generated tokens, or with "max_seq_len" once
        offset has reached max_seq_len (no room left in the cache to feed the token).
        """
        # Week 2 Day 6 Task 1: accept: EOS finishes with 'stop' (the token is not kept);
        # otherwise append it to tokens, feed the detokenizer, and finish with 'length'
        # at max_tokens or 'max_seq_len' when offset reaches it;
        # constraint_state.advance and sampling_state.advance a kept token first
        self.metrics.record_token()
        if token in self.tokenizer.eos_token_ids:
            self.finish("stop")
            return
        self.constraint_state.advance(token)
        self.sampling_state.advance(token)
        self.tokens.append(token)
        self.detokenizer.add_token(token)
        if self.max_tokens is not None and len(self.generated) >= self.max_tokens:
            self.finish("length")
        elif self.offset >= self.max_seq_len:
            self.finish("max_seq_len")  # no room left in the cache to feed the token

    def finish(self, reason: str) -> None:
        """End the request: finish_reason (so no next_token), no cache, the
        detokenizer flushed (finalize). Its decode slot, if any, is the planner's to
        free. Only an unfinished request is finished, so it always has a
        detokenizer (a rejected prompt is finished from the start, by fail)."""
        # Week 2 Day 6 Task 1: finish: set finish_reason, drop the cache, finalize the
        # detokenizer
        self.finish_reason = reason
        self.detokenizer.finalize()
        self.kv_cache = None

    def fail(self, message: str) -> None:
        """Finish this request alone with "error", `message` saying why; the tokens
        so far are kept, the cache dropped."""
        self.error = message
        self.finish_reason = "error"
        self.kv_cache = None

    def result(self) -> GenerationResult:
        """This request's GenerationResult; cached_tokens is metrics.cached_tokens
        (week 3 day 3); logprobs and prompt_logprobs are the sampling state's."""
        state = self.sampling_state
        return GenerationResult(
            self.text,
            list(self.generated),
            self.finish_reason,
            self.metrics,
            self.error,
            self.prompt,
            self.priority,
            self.metrics.cached_tokens,
            logprobs=list(state.logprobs),
            prompt_logprobs=state.prompt_logprobs,
            index=self.choice.index,
        )
