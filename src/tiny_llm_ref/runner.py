"""The model runner: the only place the engine's steps call the model, sample and
evaluate.

It runs a Plan (planner.py) as one forward:
- one chunk (week 2 day 7): the request's own try_prefill;
- decode rows (week 2 day 6): model(tokens [R, 1], offsets, batch cache), the last
  position's logits [R, V];
- a mixed plan (week 3 day 1): mixed_step.run_mixed, every decode row and every chunk
  in one forward, and (week 3 day 4) each speculating request's drafts.
Then every request in it moves forward in one place (Request.advance, by what the
forward fed it) and samples from its logits (Request.sample_and_accept), which may
finish it; a speculating request accepts its verified tokens (accept_drafts) and its
row keeps only those (the KV manager's keep_accepted).

A failure costs only the requests in the forward: they fail with the error, and the
run goes on. An interrupt (KeyboardInterrupt, SystemExit) fails them too, so that no
request's position and cache are left out of step, and is then raised again.
"""

from dataclasses import dataclass, field

import mlx.core as mx

from .mixed_step import run_mixed
from .planner import Plan
from .request import Request
from .speculative import accept_drafts


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
    whose batch_cache holds the decode rows."""

    def __init__(self, model, clock, kv):
        # Week 2 Day 6: ModelRunner: keep model, clock and kv
        self.model = model
        self.clock = clock
        self.kv = kv

    def run(self, plan: Plan) -> Forward | None:
        """Run the plan's forward; None when it failed (its requests failed with the
        error). A request's prefill_start is this forward's start if it has none."""
        # Week 2 Day 6: run: read the clock, set prefill_start, run the plan (mixed, one
        # chunk through try_prefill, or decode); on an error fail its requests and
        # return None; on an interrupt fail them and raise; else a Forward
        requests = [r for r, _ in plan.chunks] + [r for r in plan.rows if r]
        start = self.clock()
        for request, _ in plan.chunks:
            if request.metrics.prefill_start is None:
                request.metrics.prefill_start = start
        drafts = []
        try:
            if plan.mixed:
                drafts = self.run_mixed_step(plan)
            elif plan.chunks:
                [(request, tokens)] = plan.chunks
                request.try_prefill(tokens)
            else:
                self.decode(plan, self.kv.batch_cache)
        except Exception as error:  # fails this forward's requests, not the run
            self.fail(requests, f"{type(error).__name__}: {error}", plan)
            return None
        except BaseException as interrupt:
            self.fail(requests, f"interrupted by {type(interrupt).__name__}", plan)
            raise
        decodes = [r for r in plan.rows if r]
        seconds = self.clock() - start
        return Forward(start, seconds, plan.chunks, decodes, plan.mixed, drafts)

    def run_mixed_step(self, plan: Plan) -> list[tuple[Request, int, int]]:
        """A mixed plan's forward (mixed_step.run_mixed); the rows without drafts
        accept a token each (accept_rows); each request with drafts accepts what
        verification keeps (accept_drafts) and its row keeps just that
        (kv.keep_accepted). Returns (request, drafts fed, drafts accepted) per
        speculating request."""
        # Week 2 Day 6: run_mixed_step: run_mixed(model, plan, kv.batch_cache);
        # accept_rows of the rows without drafts (Week 3 Day 4: then accept_drafts and
        # keep_accepted for each request with drafts)
        decode_logits, verify_logits = run_mixed(self.model, plan, self.kv.batch_cache)
        if plan.rows:
            plain = [None if r in plan.drafts else r for r in plan.rows]
            self.accept_rows(plain, decode_logits)
        done = []
        for request, logits in verify_logits.items():
            drafts = plan.drafts[request]
            accepted = accept_drafts(request, drafts, logits)
            self.kv.keep_accepted(request, plan.rows.index(request))
            done.append((request, len(drafts), accepted))
        return done

    def fail(self, requests: list[Request], why: str, plan: Plan) -> None:
        """Every unfinished request of a forward that raised fails: "prefill
        failed: ..." for the alternate policy's chunk, "forward failed: ..." for the
        others."""
        # Week 2 Day 6: fail: request.fail("prefill failed: ..." or "forward failed:
        # ...") for each unfinished request
        kind = "prefill" if plan.chunks and not plan.mixed else "forward"
        for request in requests:
            if not request.is_finished:
                request.fail(f"{kind} failed: {why}")

    def decode(self, plan: Plan, batch_cache: list) -> None:
        """One token for every decoding request: the plan's rows, up to the highest
        slot in use (plan.decode_inputs); logits [R, V] evaluated before any request
        moves; then each request advances by 1 and samples its row."""
        # Week 2 Day 6: decode: plan.decode_inputs(), model(tokens [R, 1], offsets,
        # batch_cache), last position, mx.eval, accept_rows
        tokens, offsets = plan.decode_inputs()
        logits = self.model(mx.array(tokens)[:, None], offsets, batch_cache)
        logits = logits[:, -1, :]
        mx.eval(logits)
        self.accept_rows(plan.rows, logits)

    def accept_rows(self, rows: list[Request | None], logits: mx.array) -> None:
        """logits: [R, V]: each decoding request's fed token is in the cache now
        (advance 1) and it samples its own row."""
        # Week 2 Day 6: accept_rows: for each request row: advance(1),
        # sample_and_accept(logits[row : row + 1])
        for row, request in enumerate(rows):
            if request is not None:
                request.advance(1)
                request.sample_and_accept(logits[row : row + 1])
