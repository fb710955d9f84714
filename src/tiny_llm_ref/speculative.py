"""Speculative decoding (week 3 day 4): guess a decoding request's next tokens from its
own text, check every guess in the step's one forward, keep what the model would have
produced anyway.

A decode step streams every weight to produce one token per request, and feeding a
few more tokens costs little more (the chapter's table: 2 tokens 1.14x one, 5 tokens
1.52x). So a request that can guess its next k tokens (drafts) feeds them after its
decode token, as one short part of the mixed step:

    decode row:  next_token at offset         -> logits 0: the token after it
    draft part:  d_1 .. d_k at offset + 1 ..  -> logits 1 .. k: after each draft

Logits j is what plain decoding would see once d_1 .. d_j were accepted, so the
drafts are checked left to right: d_{j+1} stays while the model agrees with it, and
the first disagreement is replaced by the model's own token. Every step yields at
least one token, and up to k + 1.

The drafts come from prompt lookup: text that quotes or edits its prompt repeats
it, so the tokens that followed the latest earlier occurrence of the request's last
few tokens are a good guess (find_drafts). Where guesses keep failing, they cost
time and give nothing: a request whose acceptance falls below what pays stops
drafting for a while (worth_drafting).
"""

import mlx.core as mx

from tiny_llm_base import NoConstraint, greedy

from .request import Request
from .sampler import TokenSampler

# A draft token's extra cost, as a fraction of a one-token forward, as the engine
# pays it beside other decode rows: the forward alone feeds a decode token and 4
# drafts in 1.52x one token's time (0.13 a draft), but the request's drafts attend
# in a call of their own and no forward runs a step ahead of a verifying step (the
# step-ahead runner, week 2 day 6: its drafts come from the token it reads); 0.33
# drafted faster than 0.09 in three workloads of four, and than 0.15 at batch 4
# (the week 3 day 4 chapter has both).
DRAFT_TOKEN_COST = 0.33
# The same for a request decoding alone: its decode token and drafts go as one part
# (the step-ahead runner's verify_alone), so a draft costs about the forward's own
# share (at 150 tokens of context 2 tokens cost 1.12x one, 5 tokens 1.42x: the
# fast-paths appendix); at batch 1 0.15 drafted faster than 0.33 on grounded prompts
# (both drafters) and on chat with week 4 day 3's head, and alike with prompt lookup
# on chat (the week 3 day 4 chapter).
DRAFT_TOKEN_COST_ALONE = 0.15
# Generated tokens a request waits, the first time its drafts stop paying, before it
# tries again; each later pause lasts twice the one before.
RETRY_AFTER = 16
# How much one verification moves a request's acceptance average.
ACCEPTANCE_WEIGHT = 0.3
# The learned drafter (week 4 day 3) proposes a draft only while the head gives it
# at least this probability. On bench-drafter's open chat at batch 1, k = 4: no
# threshold kept 10% of the drafts fed, 0.6 45% and 0.8 55%, with the fewest steps
# for the tokens (the appendix "The engine's days, in detail").
DRAFT_CONFIDENCE = 0.8
# The learned drafter takes prompt lookup's drafts first when they follow a match of
# at least this many tokens (and prompt_lookup_min): on bench-drafter at batch 1,
# lookups of 3 tokens only took 291 steps for the grounded workload's 701 tokens,
# lookups of 2 270 (prompt lookup alone 272), and open chat 856 against 871 steps.
LEARNED_LOOKUP_MIN = 2


def find_drafts(tokens: list[int], k: int, max_n: int, min_n: int) -> list[int]:
    """Prompt lookup: up to k tokens that followed an earlier occurrence of the
    sequence's last n tokens, n as long as possible from max_n down to min_n.

    tokens: the request's prompt and generated tokens. Of the earlier occurrences
    with the longest match (at most max_n), the latest wins; its continuation may
    run into the end of `tokens`, so fewer than k may come back. No occurrence of at
    least min_n tokens: []. An earlier occurrence ends at any index before the last
    token (len - 2 first); its backward match may overlap the last run itself (in
    `a a a a` the end at index 2 matches 3 tokens) and stops at the text's start.
    k >= 1: plan_drafts never asks for fewer.
    """
    # Week 3 Day 4 Task 1: find_drafts: the docstring's rule (the chapter's "Drafts from
    # the request's own text")
    last = len(tokens) - 1
    best_length, best_end = 0, -1
    for end in range(last - 1, -1, -1):
        length = 0
        while (
            length < max_n
            and length <= end
            and tokens[end - length] == tokens[last - length]
        ):
            length += 1
        if length > best_length:
            best_length, best_end = length, end
            if length == max_n:
                break
    if best_length < min_n:
        return []
    return tokens[best_end + 1 : best_end + 1 + k]


def break_even(rows: int, cost: float = DRAFT_TOKEN_COST) -> float:
    """The acceptance at which drafts neither gain nor lose, in a step of `rows`
    decode rows.

    Without drafts the step costs 1 + cost x (rows - 1) one-token forwards and makes
    `rows` tokens; k drafts add cost x k and bring acceptance x k tokens. Tokens per
    second are unchanged when acceptance x (1 + cost x (rows - 1)) = cost x rows,
    whatever k: at cost 0.33, at 1 row 33% and at 4 rows 66%; at 0.15 alone, 15%.
    """
    # Week 3 Day 4 Task 1: break_even: the acceptance at which drafting's gain pays for
    # its cost (derive it: the chapter's "When drafts do not pay")
    return cost * rows / (1 + cost * (rows - 1))


def worth_drafting(
    acceptance: float, rows: int, cost: float = DRAFT_TOKEN_COST
) -> bool:
    """Do drafts accepted at rate `acceptance` pay (or break even) in a step of `rows`
    decode rows? acceptance >= break_even(rows, cost)."""
    # Week 3 Day 4 Task 1: worth_drafting: acceptance >= break_even(rows, cost)
    return acceptance >= break_even(rows, cost)


def is_greedy(sampler) -> bool:
    """The sampler picks the most likely token: tiny_llm_base.greedy, or a
    TokenSampler at temp 0."""
    # Week 3 Day 4 Task 1: is_greedy: greedy itself, or a TokenSampler with temp 0
    return sampler is greedy or (
        isinstance(sampler, TokenSampler) and sampler.temp == 0
    )


def can_verify(sampler) -> bool:
    """Drafts can be checked without changing what the sampler would produce: it is
    greedy, or a TokenSampler whose distribution (its logits) is known. Any other
    function is a black box: its requests never draft."""
    # Week 3 Day 4 Task 1: can_verify: is_greedy, or a TokenSampler
    return is_greedy(sampler) or isinstance(sampler, TokenSampler)


def may_draft(request: Request, rows: int) -> bool:
    """May this decoding request propose drafts in a step of `rows` decode rows?

    Only with a sampler that can be verified (can_verify), a sampling state that
    allows_drafts (a request with sampling options, tiny_llm_base, goes one token
    at a time) and a next token to feed, and not while it is paused. When its
    acceptance average no longer pays (worth_drafting at `cost`: DRAFT_TOKEN_COST,
    or DRAFT_TOKEN_COST_ALONE when rows is 1), it pauses: RETRY_AFTER generated
    tokens the first time, twice as long as the last pause each time after
    (drafting.pauses counts them). Its average is set to break_even(rows, cost), so
    the verification after the pause is a probe: a better acceptance than
    break-even keeps it drafting, a worse one starts the next pause.

    In this order: the sampler, allows_drafts and next_token (None: False); while
    len(request.generated) < drafting.resume_at, False with nothing changed; then
    worth_drafting; when it says no, resume_at = len(request.generated) +
    RETRY_AFTER * 2 ** pauses, pauses + 1, acceptance = break_even(rows, cost),
    False. Generated tokens are len(request.generated) (an EOS is never among them).
    """
    # Week 3 Day 4 Task 1: may_draft: the docstring's rule (the chapter's "When drafts
    # do not pay")
    if not can_verify(request.sampler) or request.next_token is None:
        return False
    if not request.sampling_state.allows_drafts:
        return False
    drafting = request.drafting
    if len(request.generated) < drafting.resume_at:
        return False
    cost = DRAFT_TOKEN_COST_ALONE if rows == 1 else DRAFT_TOKEN_COST
    if not worth_drafting(drafting.acceptance, rows, cost):
        pause = RETRY_AFTER * 2**drafting.pauses
        drafting.resume_at = len(request.generated) + pause
        drafting.pauses += 1
        drafting.acceptance = break_even(rows, cost)
        return False
    return True


def propose_drafts(request: Request, k: int, config) -> list[int]:
    """Up to k draft tokens for a decoding request. A constrained request (its
    constraint_state is not a NoConstraint) proposes only what its constraint forces,
    the first k of constraint_state.forced_tokens(), and only with config.jump_forward
    (week 3 day 5 writes forced_tokens; no constrained request exists before it).
    Any other request proposes with config.speculative "ngram": prompt lookup over
    its tokens, prompt and generated (find_drafts over request.tokens with
    prompt_lookup_max and _min); with "learned" (week 4 day 3) lookup of runs of
    at least LEARNED_LOOKUP_MIN tokens (min_n = the larger of it and
    prompt_lookup_min, at most prompt_lookup_max: the text quotes itself), and
    where that finds nothing, config.draft_head's drafts from the request's
    drafting.hidden and next_token while the head is at least DRAFT_CONFIDENCE
    sure of them (none while hidden is None); else nothing."""
    # Week 3 Day 4 Task 3: propose_drafts: the docstring's two cases. Week 4 Day 3:
    # "learned": lookup of runs of at least LEARNED_LOOKUP_MIN, else the draft head
    if not isinstance(request.constraint_state, NoConstraint):
        if not config.jump_forward:
            return []
        return request.constraint_state.forced_tokens()[:k]
    if config.speculative not in ("ngram", "learned"):
        return []
    longest = config.prompt_lookup_max
    if config.speculative == "ngram":
        return find_drafts(request.tokens, k, longest, config.prompt_lookup_min)
    shortest = min(longest, max(config.prompt_lookup_min, LEARNED_LOOKUP_MIN))
    quoted = find_drafts(request.tokens, k, longest, shortest)
    hidden = request.drafting.hidden
    if quoted or hidden is None:
        return quoted
    return config.draft_head.draft(hidden, request.next_token, k, DRAFT_CONFIDENCE)


def plan_drafts(planner, rows: list[Request | None], budget: float) -> dict:
    """Each decoding request's drafts for this step: {request: draft tokens}.

    For each request in `rows` that may_draft (asked with the count of the requests
    in `rows`, the None dummy rows left out): at most num_speculative_tokens, at
    most the budget left (tokens; math.inf: no limit, and min() of an int and inf is
    the int), and few enough that its bonus token stays within max_tokens
    (max_tokens - 1 - len(generated); no bound when max_tokens is None) and every
    position within max_seq_len (max_seq_len - 1 - offset); propose_drafts; then
    cut to the room the KV manager gives beside its decode token
    (planner.reserve(request, 1 + drafts) - 1; 0 or less: no drafts).

    The budget is checked before asking may_draft, which can start a pause: once it
    is 0, later requests are not asked. A request whose k comes out 0 or less is
    skipped without proposing; only a request with drafts asks planner.reserve (its
    decode row already has its room).
    """
    # Week 3 Day 4 Task 3: plan_drafts: the docstring's bounds, in its order
    config = planner.config
    decoding = [r for r in rows if r is not None]
    drafts = {}
    for request in decoding:
        if budget <= 0:
            break
        if not may_draft(request, len(decoding)):
            continue
        k = min(config.num_speculative_tokens, request.max_seq_len - 1 - request.offset)
        if request.max_tokens is not None:
            k = min(k, request.max_tokens - 1 - len(request.generated))
        k = min(k, budget)
        if k < 1:
            continue
        guess = propose_drafts(request, k, config)
        if guess:
            guess = guess[: planner.reserve(request, 1 + len(guess)) - 1]
        if guess:
            drafts[request] = guess
            budget -= len(guess)
    return drafts


def verified_tokens(sampler, drafts: list[int], logprobs: mx.array) -> list[int]:
    """The tokens plain decoding would have produced: the drafts kept, then one
    token of the model's own.

    logprobs: [k + 1, V]: row j is the next-token distribution after the decode
    token and drafts[:j]. Greedy: the longest prefix of drafts that equals the
    rows' argmax, then the argmax after it. Sampled (a TokenSampler), by the
    speculative sampling rule with drafts proposed for sure: draft d at row j is kept
    with probability p_j(d), p_j being the sampler's distribution (softmax of its
    logits: kept when mx.random.uniform() < p_j(d)); the first one rejected is
    replaced by a token drawn from p_j with d removed (renormalised: set d's logit
    to -inf and let mx.random.categorical normalise); all kept: a last token is
    drawn from p_k. Each token then has exactly the sampler's distribution.
    """
    # Week 3 Day 4 Task 2: verified_tokens: the acceptance rule of the docstring, greedy
    # and sampled (the chapter's "The acceptance rule")
    if is_greedy(sampler):
        best = mx.argmax(logprobs, axis=-1).tolist()
        kept = 0
        while kept < len(drafts) and drafts[kept] == best[kept]:
            kept += 1
        return best[: kept + 1]
    probs = mx.softmax(sampler.logits(logprobs), axis=-1)
    tokens = []
    for row, draft in enumerate(drafts):
        if mx.random.uniform().item() < probs[row, draft].item():
            tokens.append(draft)
            continue
        rest = probs[row].at[draft].multiply(0.0)
        tokens.append(mx.random.categorical(mx.log(rest)).item())
        return tokens
    tokens.append(mx.random.categorical(mx.log(probs[len(drafts)])).item())
    return tokens


def record_verification(request: Request, proposed: int, accepted: int) -> None:
    """After a verification: the request's metrics count the drafts proposed and
    accepted, and its acceptance average moves ACCEPTANCE_WEIGHT of the way towards
    accepted / proposed (drafting.acceptance: what may_draft reads). proposed >= 1:
    only a request that fed drafts is verified."""
    # Week 3 Day 4 Task 2: record_verification: metrics.draft_tokens and
    # accepted_draft_tokens; drafting.acceptance moves ACCEPTANCE_WEIGHT towards the
    # rate
    request.metrics.draft_tokens += proposed
    request.metrics.accepted_draft_tokens += accepted
    drafting = request.drafting
    drafting.acceptance += ACCEPTANCE_WEIGHT * (
        accepted / proposed - drafting.acceptance
    )
