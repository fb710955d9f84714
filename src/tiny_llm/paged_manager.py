"""The paged KV manager (week 3 day 2): the KV manager's interface over a pool of
blocks.

A request holds a BlockTable. Admission gives it the blocks its whole prompt needs
(or says no, and it waits: first come, first served); a decoding request whose next
token starts a new block gets one more (or the planner preempts somebody); a request
that is done gives its blocks back. Its PagedKvCache views (one per layer) are what
the model writes and reads, while it prefills and, moved into a decode row, after.
"""

from tiny_llm_base import EngineConfig

from .kv_manager import KvManager
from .paged_cache import (
    BlockPool,
    BlockTable,
    LayerBlocks,
    PagedBatchingKvCache,
    PagedKvCache,
    blocks_needed,
    check_pool_fits,
)
from .request import Request


class PagedKvManager(KvManager):
    """A pool of config.num_pool_blocks blocks of block_size positions.

    pool: the BlockPool (ids, refcounts). layer_blocks: one LayerBlocks per layer
    (its keys and values arrays). batch_cache: one PagedBatchingKvCache per layer.
    tables: request -> its BlockTable, for every request holding blocks. Count the
    layers as len(model.create_kv_cache()): `model` may be a wrapper that shows
    nothing else.
    A pool that could not fit in this machine's memory is refused here, before
    anything is allocated (check_pool_fits).
    """

    def __init__(self, model, config: EngineConfig):
        raise NotImplementedError(
            "Week 3 Day 2: PagedKvManager: check_pool_fits, the BlockPool, a "
            "LayerBlocks and a PagedBatchingKvCache per layer, no tables"
        )

    def admit(self, request: Request) -> bool:
        """The blocks the request's prefill needs, after those it finds cached
        (cached_prefix); False, holding nothing, when the pool has too few. Its
        PagedKvCaches start at the cached tokens, and so does the request (advance).
        """
        raise NotImplementedError(
            "Week 3 Day 2: admit: cached_prefix, allocate the missing blocks (or "
            "release and return False), PagedKvCache views from the cached tokens, "
            "advance"
        )

    def cached_prefix(self, request: Request) -> BlockTable:
        """The blocks of the request's prompt that are already computed: none
        without prefix caching (day 3's PrefixCachingKvManager finds them)."""
        raise NotImplementedError("Week 3 Day 2: cached_prefix: an empty BlockTable")

    def grow(self, request: Request) -> bool:
        """A decoding request whose next token starts a new block gets one; False
        when the pool has none left."""
        raise NotImplementedError(
            "Week 3 Day 2: grow: a new block when offset has reached the table end; "
            "False when the pool has none"
        )

    def release(self, request: Request) -> None:
        """The request's blocks go back to the pool."""
        raise NotImplementedError(
            "Week 3 Day 2: release: pool.release of the table popped from tables"
        )

    def after_step(self) -> None:
        """Nothing to do after a step without prefix caching."""

    def record(self, metrics) -> None:
        """The pool in the run's metrics: its size, blocks held, the most held at
        once, blocks cached, and the bytes one token takes."""
        raise NotImplementedError(
            "Week 3 Day 2: record: kv_blocks_total, kv_block_size and "
            "record_blocks(in use, peak, cached, bytes per token)"
        )

    def kv_bytes_per_token(self) -> int:
        """Bytes of keys and values one token takes over all layers (0 before the
        pool's arrays exist)."""
        raise NotImplementedError(
            "Week 3 Day 2: kv_bytes_per_token: keys and values bytes per position, "
            "summed over layers"
        )
