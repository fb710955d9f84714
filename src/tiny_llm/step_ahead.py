"""Decode a step ahead: the next decode forward starts before this step's tokens are
read, so that the engine's Python (accepting tokens, detokenizing, planning, the
caller's loop) runs while the model computes. mlx-lm's generate_step and
BatchGenerator do the same with mx.async_eval; vLLM and SGLang schedule a step ahead.
Also verify_alone, the speculative step's fast path (below).

Given code: a fast path of the model runner (runner.py), which stays the one place a
step's results land. The Engine runs it; ModelRunner alone (week 2 day 6) is the
synchronous path it falls back to, and gives the same tokens.

A plan of decode rows only (the alternate policy's decode forward; a mixed plan
without chunks or drafts, whose forward is the same) runs as:
1. its logits: the forward started last step when it fits this plan (each of its
   requests still in the same row, at the position it was fed; a row may have
   emptied since), else a forward of its own;
2. each row's token drawn lazily (Request.sample: the token is not read) and started
   (mx.async_eval);
3. the next forward, built on those lazy tokens at offset + 1, and started, when
   every row has room for that position (the KV manager's has_room: a paged row in
   the blocks it holds; a step that needs a new block runs synchronously, and the
   next plan reserves it);
4. only then this step's tokens are read and accepted, row by row
   (Request.accept_drawn, the failure path of Request.sample_and_accept).
A step starts the next forward only while no request waits for a row
(`quiet`: Engine.nothing_waits), so that the next plan has the same rows: with a
queue, a row freed by an EOS (which no one can see coming) goes to the next request
at once, and it decodes in the step after its prompt ends. A request that left its
row in between (EOS, an abort, a failure, a preemption) has its row ignored; one
placed in a row in between (it arrived from another thread) decodes a step late,
fed in the next forward started ahead, and is not among this step's forward's
decodes (decoded).

A mixed plan with chunks, made while a forward runs ahead (a request arrived or
a row freed since it started), takes its rows' logits from that forward and runs
its chunks in a forward of their own (ModelRunner.run_mixed without rows); drafts
planned then are not fed (each row decodes one token: the same output). No forward
starts ahead under speculative decoding (a row's drafts depend on the token read),
so a plan with drafts runs as ModelRunner.run_mixed does; but when every decoding
row drafts (always so at batch 1), its second fast path, verify_alone, feeds each
request's decode token and drafts as one part, with no decode rows (same tokens,
one attention call a request instead of two). With keep_hidden (the learned
drafter, week 4 day 3) a plan of decode rows runs as ModelRunner.run_mixed, which
keeps their hidden states.

A step runs as ModelRunner.decode does, synchronously, when some row cannot go
ahead: a constraint or sampling options that read each token (reads_each_token: a
constraint masks the next logits by the token, penalties and seeds read the
tokens), or a request that this token finishes by max_tokens or max_seq_len.
"""

from collections.abc import Callable
from dataclasses import dataclass

import mlx.core as mx

from .mixed_step import PrefillChunk, mixed_forward
from .planner import Plan
from .request import Request
from .runner import Forward, ModelRunner, accept_drafts


@dataclass
class Ahead:
    """A forward started a step ahead: its rows, the position each was fed at (0 for
    an empty row) and its logits [R, V], not yet read."""

    rows: list[Request | None]
    offsets: list[int]
    logits: mx.array


def can_go_ahead(request: Request) -> bool:
    """True when the request's next token needs no token read first and does not
    finish it by max_tokens or max_seq_len."""
    return (
        not request.constraint_state.reads_each_token
        and not request.sampling_state.reads_each_token
        and (
            request.max_tokens is None
            or len(request.generated) + 1 < request.max_tokens
        )
        and request.offset + 1 < request.max_seq_len
    )


def token_or_zero(drawn: object) -> mx.array:
    """A sampler's answer as the next forward's input [1] (int32); token 0 for an
    answer that is not one integer, or an exception: that request fails when it
    lands, and its row's result is ignored."""
    if (
        isinstance(drawn, mx.array)
        and drawn.size == 1
        and mx.issubdtype(drawn.dtype, mx.integer)
    ):
        return drawn.reshape(1).astype(mx.int32)
    return mx.array([0], mx.int32)


class StepAheadRunner(ModelRunner):
    """ModelRunner whose decode forwards run a step ahead (see the module).

    quiet: True when no request can take a row next step: only then does a step
    start the next forward, since a request placed in a new row would not fit it."""

    def __init__(
        self,
        model,
        clock,
        kv,
        quiet: Callable[[], bool] = lambda: True,
        keep_hidden: bool = False,
    ):
        super().__init__(model, clock, kv, keep_hidden)
        self.quiet = quiet
        self.ahead: Ahead | None = None
        self.late: list[Request] = []

    def run(self, plan: Plan) -> Forward | None:
        """ModelRunner.run, with no row late before the plan runs."""
        self.late = []
        return super().run(plan)

    def decoded(self, plan: Plan) -> list[Request]:
        """The plan's decoding requests but those placed in a row since the forward
        ahead started (late): they did not decode in this step's forward."""
        return [r for r in super().decoded(plan) if r not in self.late]

    def decode(self, plan: Plan) -> None:
        rows = plan.rows
        logits, late = self.take_ahead(rows)
        self.late = late
        if logits is None and not all(r is None or can_go_ahead(r) for r in rows):
            return super().decode(plan)
        if logits is None:
            tokens, offsets = plan.decode_inputs()
            inputs = mx.array(tokens)[:, None]
            logits = self.model(inputs, offsets, self.kv.batch_cache)[:, -1, :]
        landing = [None if r in late else r for r in rows]
        drawn = self.draw(landing, logits)
        if drawn is None:
            mx.eval(logits)
            self.accept_rows(landing, logits)
            return
        fed = [
            mx.array([r.next_token], mx.int32) if r in late else token_or_zero(d)
            for r, d in zip(rows, drawn)
        ]
        tokens = mx.concatenate(fed)
        mx.async_eval(tokens)
        if self.quiet():
            self.start_ahead(rows, tokens, late)
        mx.eval(tokens)
        self.land(landing, drawn)

    def run_mixed(self, plan: Plan) -> list[tuple[Request, int, int]]:
        """A mixed plan: decode rows alone as decode (the same forward; with
        keep_hidden, ModelRunner.run_mixed, which keeps their hidden states);
        drafts in every decoding row, no chunk and no forward ahead, verify_alone;
        with chunks or drafts while a forward runs ahead, its rows from that
        forward, then the chunks' own forward; else ModelRunner.run_mixed."""
        if not plan.chunks and not plan.drafts and not self.keep_hidden:
            self.decode(plan)
            return []
        decoding = [r for r in plan.rows if r is not None]
        alone = plan.drafts and len(plan.drafts) == len(decoding)
        if alone and not plan.chunks and self.ahead is None:
            return self.verify_alone(plan)
        if self.ahead is None:
            return super().run_mixed(plan)
        if plan.rows:
            self.decode(Plan(rows=plan.rows))
        if plan.chunks:
            super().run_mixed(Plan(chunks=plan.chunks, mixed=True))
        return []

    def verify_alone(self, plan: Plan) -> list[tuple[Request, int, int]]:
        """A plan whose every decoding request drafts (no forward runs ahead under
        speculation): each one's decode token and drafts go as ONE part at its
        offset, in its batch-cache row (row_view), with no decode rows beside
        them. Two parts a request (ModelRunner.run_mixed's decode row, then its
        drafts) cost a second attention call and cache write in every layer: at
        batch 1, 45 ms against 36 for one draft. Then as ModelRunner.verify and
        keep_hidden_states: part row j follows the decode token and drafts[:j], so
        a request that keeps a drafts sampled its next token from row a."""
        slots = {r: plan.rows.index(r) for r in plan.drafts}
        parts = [
            PrefillChunk(
                [r.next_token, *drafts],
                r.offset,
                [layer.row_view(slots[r], r.offset) for layer in self.kv.batch_cache],
                logit_rows=1 + len(drafts),
            )
            for r, drafts in plan.drafts.items()
        ]
        _, logits, *hidden = mixed_forward(
            self.model, [], [], None, parts, with_hidden=self.keep_hidden
        )
        mx.eval(logits, hidden)
        done, start = [], 0
        for (request, drafts), checked in zip(plan.drafts.items(), logits):
            accepted = accept_drafts(request, drafts, checked)
            self.kv.keep_accepted(request, slots[request])
            if self.keep_hidden:
                request.drafting.hidden = hidden[0][start + accepted]
            start += 1 + len(drafts)
            done.append((request, len(drafts), accepted))
        return done

    def take_ahead(
        self, rows: list[Request | None]
    ) -> tuple[mx.array | None, list[Request]]:
        """The logits [len(rows), V] of the forward started ahead, and the requests
        placed in a row since (late: they had no row in it, and decode next step);
        (None, []) without one."""
        ahead, self.ahead = self.ahead, None
        if ahead is None:
            return None, []
        logits = ahead.logits
        if len(rows) > len(ahead.rows):
            padding = mx.zeros((len(rows) - len(ahead.rows), logits.shape[-1]))
            logits = mx.concatenate([logits, padding.astype(logits.dtype)])
        late = [r for r in rows if r is not None and r not in ahead.rows]
        return logits[: len(rows)], late

    def draw(self, rows: list[Request | None], logits: mx.array) -> list[object] | None:
        """Each row's token, lazy (Request.sample): the sampler's answer (an empty
        row: [0]), or the exception drawing raised, which fails that request when
        it lands. None when a row cannot go ahead."""
        if not all(r is None or can_go_ahead(r) for r in rows):
            return None
        drawn = []
        for row, request in enumerate(rows):
            if request is None:
                drawn.append(mx.array([0]))
                continue
            try:
                drawn.append(request.sample(logits[row : row + 1]))
            except Exception as error:
                drawn.append(error)
        return drawn

    def start_ahead(
        self, rows: list[Request | None], tokens: mx.array, late: list[Request]
    ) -> None:
        """Start the next decode forward on `tokens` [R] (lazy), each row at its
        offset + 1 (a late row at its offset: it has not decoded yet), when every
        row has room for that position."""
        offsets = [0 if r is None else r.offset + (r not in late) for r in rows]
        if not all(can_go_ahead(r) for r in late) or not all(
            self.kv.has_room(r, end) for r, end in zip(rows, offsets) if r is not None
        ):
            return
        fed = mx.clip(tokens, 0, self.model.vocab_size - 1)[:, None]
        logits = self.model(fed, offsets, self.kv.batch_cache)[:, -1, :]
        mx.async_eval(logits)
        self.ahead = Ahead(list(rows), offsets, logits)

    def land(self, rows: list[Request | None], drawn: list[object]) -> None:
        """This step's tokens read (the forward started ahead computes meanwhile) and
        accepted: each request's fed token is in the cache (advance 1), then it
        accepts what it drew (Request.accept_drawn: whatever fails fails that
        request alone, as in Request.sample_and_accept)."""
        for request, token in zip(rows, drawn):
            if request is not None:
                request.advance(1)
                request.accept_drawn(token)

    def fail(self, requests: list[Request], why: str, plan: Plan) -> None:
        self.ahead = None
        super().fail(requests, why, plan)
