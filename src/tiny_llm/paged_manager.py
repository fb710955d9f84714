"""The paged KV manager (week 3 day 2): the KV manager's interface over a pool of
blocks.

A request holds a BlockTable that grows with its steps. Admission gives it nothing
but its cached prefix (day 3); before each forward the planner reserves the blocks
that step's tokens need (a prefill chunk's, or a decode's when its next token
starts a block), and a request that is done gives its blocks back. So a chunked
prefill holds blocks only for positions it has computed or is computing, as vLLM's
v1 scheduler does. Its PagedKvCache views (one per layer) are what the model writes
and reads, while it prefills and, moved into a decode row, after.
"""

from tiny_llm_base import EngineConfig

from .kv_manager import KvManager
from .block_pool import BlockPool, BlockTable, blocks_needed
from .layer_blocks import LayerBlocks, check_pool_fits
from .paged_cache import PagedBatchingKvCache, PagedKvCache
from .quantized_pool import QuantizedLayerBlocks
from .request import Request


class PagedKvManager(KvManager):
    """A pool of config.pool_blocks(model) blocks of block_size positions: the KV
    budget (kv_memory, or num_blocks), which the arrays grow towards as blocks are
    used.

    pool: the BlockPool (ids, refcounts). layer_blocks: one LayerBlocks per layer
    (its keys and values arrays; a QuantizedLayerBlocks when config.kv_dtype is not
    "float32"). batch_cache: one PagedBatchingKvCache per layer.
    tables: request -> its BlockTable, for every request holding blocks.
    block_size: config.block_size (has_room, given, reads it). Count the
    layers as len(model.create_kv_cache()): `model` may be a wrapper that shows
    nothing else.
    A budget that could not fit in this machine's memory is refused here, before
    anything is allocated (check_pool_fits).
    """

    def __init__(self, model, config: EngineConfig):
        raise NotImplementedError(
            "Week 3 Day 2 Task 4: PagedKvManager: config.pool_blocks(model) blocks, "
            "check_pool_fits (with config.kv_dtype), block_size, the BlockPool, a "
            "LayerBlocks (a QuantizedLayerBlocks of config.kv_dtype when it is not "
            "'float32') and a PagedBatchingKvCache per layer, no tables"
        )

    def admit(self, request: Request) -> int | None:
        """The request starts holding blocks: those of its prompt found cached
        (cached_prefix), and none yet for the rest; None, holding nothing (the
        prefix's blocks given back, pool.release), when the pool has no block
        available. Its PagedKvCaches start at the cached
        tokens; returns how many (the planner moves the request past them)."""
        raise NotImplementedError(
            "Week 3 Day 2 Task 4: admit: cached_prefix; if the pool has no block "
            "available, pool.release its blocks and return None; else the table, "
            "PagedKvCache views from the cached tokens, and their count"
        )

    def cached_prefix(self, request: Request) -> BlockTable:
        """The blocks of the request's prompt that are already computed. A later
        choice of a prompt asked n times (request.choice.first) shares the full
        blocks its first choice holds of their prompt (metrics.prompt_tokens: after
        a restart prefill_length also counts its own generated tokens, which the
        first choice's blocks do not hold), all but its last token's
        (pool.share: one more holder each; the first choice writes only past them),
        so it computes only the rest; none when the first choice holds no blocks.
        Otherwise none (day 3's PrefixCachingKvManager finds them in its cache)."""
        raise NotImplementedError(
            "Week 3 Day 2 Task 4: cached_prefix: for a request with a choice.first in"
            " tables, a BlockTable of pool.share(its first min((metrics.prompt_tokens"
            " - 1) // block_size, first choice's offset // block_size) blocks); else "
            "an empty BlockTable"
        )

    def reserve(self, request: Request, tokens: int) -> int:
        """Room for up to `tokens` more tokens of the request, from its offset: the
        blocks they need beyond its table, as many as the pool has. Returns how
        many tokens fit (0 when the pool has no block for the next one)."""
        raise NotImplementedError(
            "Week 3 Day 2 Task 4: reserve: the blocks needed for offset + tokens "
            "beyond the table, at most pool.available; allocate them; return the "
            "tokens the table now has room for, at most `tokens`"
        )

    def has_room(self, request: Request, position: int) -> bool:
        """`position` falls within the blocks the request's table holds (none is
        taken here: blocks are reserved by the planner, for the tokens computed)."""
        return position < len(self.tables[request].blocks) * self.block_size

    def keep_accepted(self, request: Request, slot: int) -> None:
        """As the dense manager's, and the blocks past the request's offset (reserved
        for drafts that were rejected) go back to the pool and are cut from its
        BlockTable in place (the slot's view shares that table object). It runs even
        when the request has just finished inside the accepted run."""
        raise NotImplementedError(
            "Week 3 Day 4 Task 3: keep_accepted: every row's offset, then "
            "pool.release of the table's blocks past blocks_needed(request.offset)"
        )

    def release(self, request: Request) -> None:
        """The request's blocks go back to the pool."""
        raise NotImplementedError(
            "Week 3 Day 2 Task 4: release: pool.release of the table popped from tables"
        )

    def after_step(self) -> None:
        """Whatever a failed forward left staged is dropped: it must never be
        written over blocks that have changed hands."""
        raise NotImplementedError(
            "Week 3 Day 2 Task 4: after_step: empty every layer's staged list"
        )

    def record(self, metrics) -> None:
        """The pool in the run's metrics: its size, blocks held, the most held at
        once, blocks cached, and the bytes one token takes."""
        raise NotImplementedError(
            "Week 3 Day 2 Task 4: record: kv_blocks_total, kv_block_size and "
            "record_blocks(in use, peak, cached, bytes per token)"
        )

    def pool_bytes(self) -> int:
        """Bytes the layers' arrays hold now."""
        raise NotImplementedError(
            "Week 3 Day 2 Task 4: pool_bytes: keys and values nbytes, summed over "
            "layers"
        )

    def kv_bytes_per_token(self) -> int:
        """Bytes of keys and values one token takes over all layers (0 before the
        pool's arrays exist): each layer's (keys.nbytes + values.nbytes) //
        (capacity x block_size), summed over the layers whose arrays exist."""
        raise NotImplementedError(
            "Week 3 Day 2 Task 4: kv_bytes_per_token: keys and values bytes per "
            "position, summed over layers"
        )
