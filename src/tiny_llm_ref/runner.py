"""The model runner: the one place where a step's results land on the requests.

It runs a Plan (planner.py) as one forward:
- one chunk (week 2 day 7): the request's own try_prefill, the one exception: a
  request prefills itself there, as day 7 teaches it;
- decode rows (week 2 day 6): model(tokens [R, 1], offsets, batch cache), the last
  position's logits [R, V];
- a mixed plan (week 3 day 1): every decode row and every chunk in one forward
  (mixed_step.mixed_forward), and (week 3 day 4) each speculating request's drafts
  as parts of their own.
Then every request in it moves forward here and nowhere else: Request.advance by
what the forward fed it, Request.sample_and_accept of its logits (which may finish
it); a speculating request accepts its verified tokens (accept_drafts) and its row
rolls back to just those (the KV manager's keep_accepted).

A failure costs only the requests in the forward: they fail with the error, and the
run goes on. An interrupt (KeyboardInterrupt, SystemExit) fails them too, so that no
request's position and cache are left out of step, and is then raised again.
"""

from dataclasses import dataclass, field
from itertools import accumulate

import mlx.core as mx

from .mixed_step import PrefillChunk, mixed_forward
from .planner import Plan
from .request import Request
from .speculative import is_greedy, record_verification, verified_tokens


@dataclass
class Forward:
    """A forward that ran: when it started, how long it took (the clock's
    seconds), the chunks (request, prompt tokens) and the decoding requests in it,
    whether it was a mixed step, and (request, drafts fed, drafts accepted) of each
    request that speculated (week 3 day 4)."""

    start: float
    seconds: float
    chunks: list[tuple[Request, int]]
    decodes: list[Request]
    mixed: bool
    drafts: list[tuple[Request, int, int]] = field(default_factory=list)


class ModelRunner:
    """model: the week 2 model (model(tokens, offset, cache) -> logits). clock: the
    engine's clock, read just before and just after each forward. kv: the KV manager,
    whose batch_cache holds the decode rows. keep_hidden (week 4 day 3): a mixed
    step also keeps each request's hidden state for its draft head
    (keep_hidden_states)."""

    def __init__(self, model, clock, kv, keep_hidden: bool = False):
        self.model = model
        self.clock = clock
        self.kv = kv
        self.keep_hidden = keep_hidden

    def run(self, plan: Plan) -> Forward | None:
        """Run the plan's forward; None when it failed (its requests failed with the
        error). A request's prefill_start is this forward's start if it has none.

        The requests in it are the chunks' and the rows'. An Exception fails them
        through fail(requests, f"{type(error).__name__}: {error}", plan); an
        interrupt (any other BaseException: KeyboardInterrupt, SystemExit) through
        fail(requests, f"interrupted by {type(interrupt).__name__}", plan), and is
        raised again."""
        # Week 2 Day 6 Task 3: run: read the clock, set prefill_start, run the plan
        # (Week 3 Day 1: run_mixed for a mixed plan; one chunk through try_prefill; else
        # decode); on an error fail its requests and return None; on an interrupt fail
        # them and raise; else a Forward
        requests = [r for r, _ in plan.chunks] + [r for r in plan.rows if r]
        start = self.clock()
        for request, _ in plan.chunks:
            if request.metrics.prefill_start is None:
                request.metrics.prefill_start = start
        drafts = []
        try:
            if plan.mixed:
                drafts = self.run_mixed(plan)
            elif plan.chunks:
                [(request, tokens)] = plan.chunks
                request.try_prefill(tokens)
            else:
                self.decode(plan)
        except Exception as error:  # fails this forward's requests, not the run
            self.fail(requests, f"{type(error).__name__}: {error}", plan)
            return None
        except BaseException as interrupt:
            self.fail(requests, f"interrupted by {type(interrupt).__name__}", plan)
            raise
        seconds = self.clock() - start
        decodes = self.decoded(plan)
        return Forward(start, seconds, plan.chunks, decodes, plan.mixed, drafts)

    def decoded(self, plan: Plan) -> list[Request]:
        """The requests the plan's forward decoded: every row's request."""
        return [r for r in plan.rows if r]

    def decode(self, plan: Plan) -> None:
        """One token for every decoding request: the plan's rows, up to the highest
        slot in use (plan.decode_inputs), through the KV manager's batch cache;
        logits [R, V] evaluated before any request moves; then accept_rows."""
        # Week 2 Day 6 Task 3: decode: plan.decode_inputs(), model(tokens [R, 1],
        # offsets, kv.batch_cache), last position, mx.eval, accept_rows
        tokens, offsets = plan.decode_inputs()
        logits = self.model(mx.array(tokens)[:, None], offsets, self.kv.batch_cache)
        logits = logits[:, -1, :]
        mx.eval(logits)
        self.accept_rows(plan.rows, logits)

    def accept_rows(self, rows: list[Request | None], logits: mx.array) -> None:
        """logits: [R, V]: each decoding request's fed token is in the cache now
        (advance 1) and it samples its own row."""
        # Week 2 Day 6 Task 3: accept_rows: for each request row: advance(1),
        # sample_and_accept(logits[row : row + 1])
        for row, request in enumerate(rows):
            if request is not None:
                request.advance(1)
                request.sample_and_accept(logits[row : row + 1])

    def run_mixed(self, plan: Plan) -> list[tuple[Request, int, int]]:
        """A mixed plan as ONE mixed_forward: the decode rows (the batch cache only
        when there are some, else None) and each chunk as a PrefillChunk at its
        request's offset with its kv_cache, one logit row when the chunk ends its
        prompt (every row when its sampling_state wants_prompt_logprobs); with drafts
        (week 3 day 4), draft_parts after the chunks. The logits and every chunk's
        cache are evaluated before any request moves. Then, in this order: each
        chunk's request advances by its length (a request wanting prompt logprobs
        hands its chunk's rows to sampling_state.observe_prompt(rows, its offset
        before)) and, if its prompt is done, samples its first token from the last
        row; the rows without drafts accept theirs (accept_rows); the requests with
        drafts verify them (verify). Returns verify's (request, drafts fed, drafts
        accepted) list, [] without drafts."""
        # Week 3 Day 1 Task 3: run_mixed: PrefillChunks (every row for a request that
        # wants prompt logprobs; and, only when the plan has drafts, draft_parts),
        # mixed_forward, mx.eval of the logits and the chunk caches; then advance each
        # chunk's request (observe_prompt first when it wants prompt logprobs) and
        # sample the last row of each that ends its prompt, accept_rows of the rows
        # without drafts, and verify when there are drafts. Week 4 Day 3: with
        # keep_hidden, mixed_forward's hidden rows too, then keep_hidden_states
        rows = plan.rows
        tokens, offsets = plan.decode_inputs()
        chunks = [
            PrefillChunk(
                r.tokens[r.offset : r.offset + n],
                r.offset,
                r.kv_cache,
                logit_rows=n
                if r.sampling_state.wants_prompt_logprobs
                else int(r.offset + n == r.prefill_length),
            )
            for r, n in plan.chunks
        ]
        drafted = self.draft_parts(plan) if plan.drafts else []
        batch_cache = self.kv.batch_cache if rows else None
        decode_logits, part_logits, *hidden = mixed_forward(
            self.model,
            tokens,
            offsets,
            batch_cache,
            chunks + drafted,
            with_hidden=self.keep_hidden,
        )
        cache_state = [
            array
            for chunk in chunks
            for layer in chunk.cache
            for array in (layer.keys, layer.values)
        ]
        mx.eval(decode_logits, part_logits, cache_state, hidden)
        chunk_logits = part_logits[: len(chunks)]
        for (request, fed), logits in zip(plan.chunks, chunk_logits):
            start = request.offset
            request.advance(fed)
            if request.sampling_state.wants_prompt_logprobs:
                request.sampling_state.observe_prompt(logits, start)
            if request.is_prefill_done:  # the chunk ended the prompt
                request.sample_and_accept(logits[-1:])
        if rows:
            self.accept_rows(
                [None if r in plan.drafts else r for r in rows], decode_logits
            )
        verified = (
            self.verify(plan, decode_logits, part_logits[len(chunks) :])
            if plan.drafts
            else []
        )
        if hidden and hidden[0] is not None:
            self.keep_hidden_states(plan, chunks + drafted, hidden[0], verified)
        return verified

    def keep_hidden_states(
        self,
        plan: Plan,
        parts: list[PrefillChunk],
        hidden: mx.array,
        verified: list[tuple[Request, int, int]],
    ) -> None:
        """hidden: [rows, E], mixed_forward's third item over the plan's decode rows
        and then each part's logit rows (its chunks, then its drafts). Each request
        keeps (drafting.hidden) the row its next token was sampled from: a decode
        row's own; the last row of a chunk that ended its prompt; for a request
        that verified drafts, its decode row when it kept none, else the row of its
        last kept draft."""
        # Week 4 Day 3 Task 3: keep_hidden_states: the docstring's three cases
        rows = hidden.shape[0] - sum(part.logit_rows for part in parts)
        starts = list(accumulate((part.logit_rows for part in parts), initial=rows))
        for (request, _), part, start in zip(plan.chunks, parts, starts):
            if part.logit_rows and request.is_prefill_done:
                request.drafting.hidden = hidden[start + part.logit_rows - 1]
        for row, request in enumerate(plan.rows):
            if request is not None and request not in plan.drafts:
                request.drafting.hidden = hidden[row]
        for (request, _, kept), start in zip(verified, starts[len(plan.chunks) :]):
            row = plan.rows.index(request)
            request.drafting.hidden = (
                hidden[row] if kept == 0 else hidden[start + kept - 1]
            )

    def draft_parts(self, plan: Plan) -> list[PrefillChunk]:
        """Each drafting request's drafts as a part of the mixed forward: a
        PrefillChunk of its drafts at offset + 1 (its decode row holds the position
        at offset), cached in its own batch-cache row (row_view of its row in every
        layer), every position sampled. Its row (slot) is plan.rows.index(request)."""
        # Week 3 Day 4 Task 3: draft_parts: one PrefillChunk per request in plan.drafts
        # (its cache: BatchingKvCache.row_view)
        return [
            PrefillChunk(
                drafts,
                r.offset + 1,
                [
                    layer.row_view(plan.rows.index(r), r.offset + 1)
                    for layer in self.kv.batch_cache
                ],
                logit_rows=len(drafts),
            )
            for r, drafts in plan.drafts.items()
        ]

    def verify(
        self, plan: Plan, decode_logits: mx.array, draft_logits: list[mx.array]
    ) -> list[tuple[Request, int, int]]:
        """decode_logits: [R, V]; draft_logits: [k_i, V] per drafting request, in
        plan.drafts' order. Each drafting request accepts what verification keeps
        (accept_drafts over its decode row's logits, then its drafts') and its row
        rolls back to just that (kv.keep_accepted, even when accept_drafts finished
        or failed it). Its row, of plan.rows and of decode_logits alike, is
        plan.rows.index(request). Returns (request, drafts fed, drafts accepted) per
        drafting request."""
        # Week 3 Day 4 Task 3: verify: accept_drafts, then the rollback, for each
        # request with drafts
        done = []
        for (request, drafts), logits in zip(plan.drafts.items(), draft_logits):
            row = plan.rows.index(request)
            checked = mx.concatenate([decode_logits[row : row + 1], logits])
            accepted = accept_drafts(request, drafts, checked)
            self.kv.keep_accepted(request, row)
            done.append((request, len(drafts), accepted))
        return done

    def fail(self, requests: list[Request], why: str, plan: Plan) -> None:
        """Every unfinished request of a forward that raised fails: "prefill
        failed: ..." for the alternate policy's chunk, "forward failed: ..." for the
        others."""
        kind = "prefill" if plan.chunks and not plan.mixed else "forward"
        for request in requests:
            if not request.is_finished:
                request.fail(f"{kind} failed: {why}")


def accept_drafts(request: Request, drafts: list[int], logits: mx.array) -> int:
    """logits: [1 + k, V], the verification logits of a request that fed its decode
    token and k drafts. Its constraint state masks row j as its sample would after
    drafts[:j] (constraint_state.masks_along, True where allowed:
    mx.where(masks, logits, -inf); without a constraint, True masks nothing); for
    a sampler that is not greedy (is_greedy) the rows become log-probabilities
    (logits - logsumexp; no sampling_state processing: a request with sampling
    options never drafts), while greedy reads its argmax from the masked logits as
    they are (the same tokens, and no logsumexp over the vocabulary: about 3 ms a
    verification on a CPU). Accepts the verified tokens (verified_tokens over
    those rows) one by one (advance 1, then accept), stopping when one finishes the
    request (EOS, max_tokens, max_seq_len), so the request ends at the right
    token; then record_verification. Returns the
    drafts accepted: tokens taken - 1, the last token taken counted as the model's
    own even when it was a draft that ended the request (drafts [a, EOS] both
    verified: 1). Whatever fails fails this request alone: request.fail with a
    message that carries the exception's type and text (f"verifying drafts failed:
    {name}: {error}"), so the client sees why, and 0 is returned."""
    # Week 3 Day 4 Task 2: accept_drafts: the docstring's contract (the chapter's
    # "Verification inside the mixed step")
    try:
        masks = request.constraint_state.masks_along(drafts)
        logits = mx.where(masks, logits, mx.array(-mx.inf, logits.dtype))
        if not is_greedy(request.sampler):
            logits = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        taken = 0
        for token in verified_tokens(request.sampler, drafts, logits):
            request.advance(1)
            request.accept(token)
            taken += 1
            if request.is_finished:
                break
    except Exception as error:
        request.fail(f"verifying drafts failed: {type(error).__name__}: {error}")
        return 0
    record_verification(request, len(drafts), taken - 1)
    return taken - 1
