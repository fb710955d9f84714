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
        # Week 3 Day 2: PagedKvManager: check_pool_fits, the BlockPool, a LayerBlocks
        # and a PagedBatchingKvCache per layer, no tables
        layers = len(model.create_kv_cache())
        num_blocks, self.block_size = config.num_pool_blocks, config.block_size
        check_pool_fits(model, num_blocks * self.block_size)
        self.pool = BlockPool(num_blocks, self.block_size)
        self.layer_blocks = [
            LayerBlocks(num_blocks, self.block_size) for _ in range(layers)
        ]
        self.batch_cache = [
            PagedBatchingKvCache(config.batch_size, config.max_seq_len)
            for _ in range(layers)
        ]
        self.tables: dict[Request, BlockTable] = {}

    def admit(self, request: Request) -> bool:
        """The blocks the request's prefill needs, after those it finds cached
        (cached_prefix); False, holding nothing, when the pool has too few. Its
        PagedKvCaches start at the cached tokens, and so does the request (advance).
        """
        # Week 3 Day 2: admit: cached_prefix, allocate the missing blocks (or release
        # and return False), PagedKvCache views from the cached tokens, advance
        tokens = request.prefill_tokens
        table = self.cached_prefix(request)
        missing = blocks_needed(len(tokens), self.block_size) - len(table.blocks)
        if missing > self.pool.available:
            self.pool.release(table.blocks)
            return False
        cached = len(table.blocks) * self.block_size
        table.blocks += self.pool.allocate(missing)
        self.tables[request] = table
        request.kv_cache = [
            PagedKvCache(layer, table, cached) for layer in self.layer_blocks
        ]
        request.advance(cached)
        return True

    def cached_prefix(self, request: Request) -> BlockTable:
        """The blocks of the request's prompt that are already computed: none
        without prefix caching (day 3's PrefixCachingKvManager finds them)."""
        # Week 3 Day 2: cached_prefix: an empty BlockTable
        return BlockTable()

    def grow(self, request: Request) -> bool:
        """A decoding request whose next token starts a new block gets one; False
        when the pool has none left."""
        # Week 3 Day 2: grow: a new block when offset has reached the table end; False
        # when the pool has none
        table = self.tables[request]
        if request.offset < len(table.blocks) * self.block_size:
            return True
        if self.pool.available == 0:
            return False
        table.blocks += self.pool.allocate(1)
        return True

    def release(self, request: Request) -> None:
        """The request's blocks go back to the pool."""
        # Week 3 Day 2: release: pool.release of the table popped from tables
        self.pool.release(self.tables.pop(request).blocks)

    def after_step(self) -> None:
        """Nothing to do after a step without prefix caching."""

    def record(self, metrics) -> None:
        """The pool in the run's metrics: its size, blocks held, the most held at
        once, blocks cached, and the bytes one token takes."""
        # Week 3 Day 2: record: kv_blocks_total, kv_block_size and record_blocks(in use,
        # peak, cached, bytes per token)
        metrics.kv_blocks_total = self.pool.num_blocks
        metrics.kv_block_size = self.block_size
        metrics.record_blocks(
            self.pool.in_use,
            self.pool.peak_in_use,
            len(self.pool.cached),
            self.kv_bytes_per_token(),
        )

    def kv_bytes_per_token(self) -> int:
        """Bytes of keys and values one token takes over all layers (0 before the
        pool's arrays exist)."""
        # Week 3 Day 2: kv_bytes_per_token: keys and values bytes per position, summed
        # over layers
        return sum(
            (layer.keys.nbytes + layer.values.nbytes)
            // (layer.num_blocks * layer.block_size)
            for layer in self.layer_blocks
            if layer.keys is not None
        )
