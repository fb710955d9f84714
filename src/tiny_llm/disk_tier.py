"""The prefix cache's disk tier (given code, built on week 3 day 3): named blocks
outlive the process, so an agent's conversation survives a restart.

    memory pool (day 3)           disk (tiny_llm_base/kv_disk.py)
    named blocks, LRU  -- evict --> one file per block, named by its chain hash
                       -- close --> (every named block, at Engine.close)
    lookup misses      <-- load --- the chain goes on from disk

A block the pool is about to evict is written to disk first (SpillingBlockPool),
and Engine.close writes every named block. A lookup that finds the first blocks of
a prompt in the pool (day 3's cached_prefix) goes on down the chain on disk: each
block found there is read, checked, written into a block of the pool and named, as
if a request had computed it. The tokens are the same as without the disk tier:
a file is loaded only when its model identity, name, token ids, layout and
signature match (tiny_llm_base/kv_disk.py says what that trusts), and a chain hash
names everything before a block's end. Files hold the rows as the pool stores them
(a quantized pool's packed words), and go back into the pool as they are.
"""

import itertools
import time
from collections.abc import Callable

import mlx.core as mx

from tiny_llm_base.kv_disk import KvDiskStore
from tiny_llm_base.kv_identity import block_layout, model_identity

from .block_pool import BlockPool, BlockTable, chain_hash
from .layer_blocks import LayerBlocks
from .prefix_cache import PrefixCachingKvManager
from .request import Request


class SpillingBlockPool(BlockPool):
    """A BlockPool that hands spill(blocks) the cached blocks an allocation is about
    to evict, while their keys and values are still intact."""

    def __init__(
        self, num_blocks: int, block_size: int, spill: Callable[[list[int]], None]
    ):
        super().__init__(num_blocks, block_size)
        self.spill = spill

    def allocate(self, count: int) -> list[int]:
        """BlockPool.allocate, which takes the free blocks first and then evicts the
        least recently used cached ones: those are spilled before it runs."""
        if count <= self.available:
            evicted = max(0, count - len(self.free))
            self.spill(list(itertools.islice(self.cached, evicted)))
        return super().allocate(count)


class DiskTierKvManager(PrefixCachingKvManager):
    """Day 3's manager, its named blocks also kept in config.kv_disk_dir (at most
    config.kv_disk_budget bytes).

    disk: the KvDiskStore of this model's blocks (its counters say what was read
    and written). The pool is a SpillingBlockPool of the same size.
    block_tokens: block -> the token ids it was named for, which its file keeps.
    blocks_loaded, load_seconds: the blocks lookups took from disk, and the time
    they took (read, checked, written into the pool).
    """

    def __init__(self, model, config):
        super().__init__(model, config)
        self.pool = SpillingBlockPool(self.pool.num_blocks, self.block_size, self.spill)
        identity = model_identity(model, self.block_size, config.kv_dtype)
        layout = block_layout(model, self.block_size, config.kv_dtype)
        self.disk = KvDiskStore(
            config.kv_disk_dir, config.kv_disk_budget, identity, layout
        )
        self.block_tokens: dict[int, list[int]] = {}
        self.blocks_loaded = 0
        self.load_seconds = 0.0

    def cached_prefix(self, request: Request) -> BlockTable:
        """The pool's cached chain (day 3), then as many of the next full blocks as
        the disk holds, each loaded into a block of the pool and named. It stops at
        a block the disk lacks, cannot read or refuses (kv_disk.py's checks), at one
        the pool holds after a gap (rare: a chain evicted out of order), and before
        the pool's last available block, which admit keeps for the request's next
        token."""
        table = super().cached_prefix(request)
        tokens = request.prefill_tokens[:-1]
        size, start_time = self.block_size, time.perf_counter()
        parent = table.hashes[-1] if table.hashes else None
        found = []  # (block, keys, values) of each block read from disk
        for start in range(len(table.blocks) * size, len(tokens) - size + 1, size):
            block_tokens = tokens[start : start + size]
            block_hash = chain_hash(parent, block_tokens)
            if (
                block_hash not in self.disk
                or block_hash in self.pool.block_of
                or self.pool.available < 2
            ):
                break
            arrays = self.disk.read(block_hash, block_tokens)
            if arrays is None:
                break
            (block,) = self.pool.allocate(1)
            self.pool.remember(block, block_hash)
            self.block_tokens[block] = block_tokens
            table.blocks.append(block)
            table.hashes.append(block_hash)
            found.append((block, *arrays))
            parent = block_hash
        if found:
            self.write_blocks(found)
            self.blocks_loaded += len(found)
            self.load_seconds += time.perf_counter() - start_time
            # The chain's root last: the most recently used file is removed last.
            self.disk.used(reversed(table.hashes[-len(found) :]))
        return table

    def write_blocks(self, found: list[tuple[int, mx.array, mx.array]]) -> None:
        """Each (block, keys, values [layers, H, block_size, W]) into its block of
        every layer: one scatter per layer for them all, evaluated now. The rows
        are as the pool stores them: LayerBlocks.stage takes them, not a
        QuantizedLayerBlocks' own stage, which would encode them again."""
        size = self.block_size
        blocks = [block for block, _, _ in found for _ in range(size)]
        slots = list(range(size)) * len(found)
        keys = mx.stack([k for _, k, _ in found], axis=1)  # [layers, n, H, size, D]
        values = mx.stack([v for _, _, v in found], axis=1)
        _, n, heads, _, dim = keys.shape
        for layer, layer_keys, layer_values in zip(self.layer_blocks, keys, values):
            LayerBlocks.stage(
                layer,
                blocks,
                slots,
                layer_keys.swapaxes(1, 2).reshape(n * size, heads, dim),
                layer_values.swapaxes(1, 2).reshape(n * size, heads, dim),
            )
            layer.flush()
        mx.eval([(layer.keys, layer.values) for layer in self.layer_blocks])

    def read_block(self, block: int) -> tuple[mx.array, mx.array]:
        """Keys and values [layers, H, block_size, W] of `block`, as the pool
        stores them."""
        keys = mx.stack([layer.keys[block] for layer in self.layer_blocks])
        values = mx.stack([layer.values[block] for layer in self.layer_blocks])
        return keys, values

    def name_full_blocks(self, request: Request) -> None:
        """Day 3's naming, each newly named block's tokens kept for its file."""
        table = self.tables[request]
        named = len(table.hashes)
        super().name_full_blocks(request)
        tokens = request.tokens
        size = self.block_size
        for index in range(named, len(table.hashes)):
            block_tokens = tokens[index * size : (index + 1) * size]
            self.block_tokens[table.blocks[index]] = block_tokens

    def spill(self, blocks: list[int]) -> None:
        """Write named blocks to disk (a block already there is only marked used)."""
        for block in blocks:
            tokens = self.block_tokens[block]
            self.disk.write(self.pool.hash_of[block], tokens, *self.read_block(block))

    def close(self) -> None:
        """Write every named block, least recently used first, as many of the most
        recent as the budget holds: the cached ones in their order, then the ones
        requests still hold."""
        pool = self.pool
        held = [b for b in pool.hash_of if b not in pool.cached]
        named = list(pool.cached) + held
        if not named:
            return
        block_bytes = sum(a.nbytes for a in self.read_block(named[0]))
        self.spill(named[max(0, len(named) - self.disk.budget // block_bytes) :])
