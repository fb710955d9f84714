"""Prefix caching (week 3 day 3): a prompt starts after the blocks an earlier request
already computed.

A full block is named by chain_hash(the previous block's name, its token ids), so
equal names mean equal tokens from position 0 to the block's end, hence equal keys
and values. The manager names every request's full blocks as they fill (after each
step, and when the request lets go of them); the pool remembers named blocks even
after nobody holds them (BlockPool.remember, least recently used out first); a new
request looks its prompt up (BlockPool.lookup) and shares what it finds.

Two rules keep it correct:
- only full blocks are named: a partial block may still change;
- the lookup covers all but the prompt's last token: that one is always computed,
  since the request samples its first token from that position's logits.
"""

from .block_pool import BlockTable, chain_hash
from .paged_manager import PagedKvManager
from .request import Request


class PrefixCachingKvManager(PagedKvManager):
    """The paged manager, sharing full blocks between requests.

    prompt_tokens, cached_tokens: over the requests admitted (once each, at their
    first admission, not after a preemption), their prompt tokens and how many
    came from the cache: the run's hit rate.
    """

    def __init__(self, model, config):
        super().__init__(model, config)
        # Week 3 Day 3 Task 2: PrefixCachingKvManager: the paged manager, counters at 0
        self.prompt_tokens = 0
        self.cached_tokens = 0

    def cached_prefix(self, request: Request) -> BlockTable:
        """The longest chain of cached full blocks that starts the request's prompt,
        over all but its last token (pool.lookup); none for a request whose
        sampling_state wants_prompt_logprobs: a cached position has no logits. It
        replaces the paged manager's whole (a later choice finds its first choice's
        blocks by lookup once they are named)."""
        raise NotImplementedError(
            "Week 3 Day 3 Task 2: cached_prefix: an empty BlockTable when the request"
            " wants prompt logprobs, else pool.lookup(prefill_tokens[:-1])"
        )

    def admit(self, request: Request) -> int | None:
        """PagedKvManager.admit, which starts the request's caches after its cached
        prefix; only when it succeeds, and only at the request's first admission
        (metrics.preemptions == 0: a request refused or preempted earlier is not
        counted twice), metrics.cached_tokens = the tokens found, prompt_tokens +=
        len(prefill_tokens) and cached_tokens += the tokens found. Returns what the
        paged admit returned."""
        raise NotImplementedError(
            "Week 3 Day 3 Task 2: admit: the paged admit, then at a first admission "
            "count the cached tokens"
        )

    def after_step(self) -> None:
        """The paged after_step, then name every holder's newly filled blocks."""
        raise NotImplementedError(
            "Week 3 Day 3 Task 2: after_step: the paged after_step, then "
            "name_full_blocks of every holder"
        )

    def release(self, request: Request) -> None:
        """Name the request's full blocks before they go back: the pool keeps them
        cached for later prompts."""
        raise NotImplementedError(
            "Week 3 Day 3 Task 2: release: name_full_blocks, then the paged release"
        )

    def name_full_blocks(self, request: Request) -> None:
        """Name each full block of the request not named yet: chain_hash(the previous
        block's name, its tokens), then pool.remember(block, name); the name joins
        table.hashes even when remember keeps an earlier block under it, so the
        chain goes on. Its tokens are request.tokens (prompt, then generated);
        `offset` says how many are in the cache: blocks len(table.hashes) ..
        offset // block_size - 1 get names. Called only for a request in tables."""
        raise NotImplementedError(
            "Week 3 Day 3 Task 2: name_full_blocks: chain_hash each full block not "
            "named yet and pool.remember it"
        )

    def record(self, metrics) -> None:
        """The pool's figures (PagedKvManager.record) and the prompt tokens found
        cached."""
        raise NotImplementedError(
            "Week 3 Day 3 Task 2: record: the paged figures and the prefix counters"
        )
