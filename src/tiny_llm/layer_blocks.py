"""Week 3 day 2: one layer's storage for the paged KV cache: keys and values in
fixed-size blocks of one shared pool (block_pool.py keeps the ids and their tables;
paged_cache.py the requests' views that read and write through them).

A layer's pool is keys and values `[blocks, H, block_size, D]`, kept in a
LayerBlocks. Two rules make the pool cost what the tokens cost, not what the pool
could hold:
- Memory: a layer's arrays grow (doubling, up to num_blocks) to cover the highest
  block id written, and the pool hands out the lowest ids first.
- Time: an MLX array is a value; `pool[idx] = x` writes in place only when nothing
  else still needs the old pool. A step with several parts (week 3 day 1's mixed
  step) therefore *stages* every part's keys first and writes them in ONE scatter
  before any part reads (LayerBlocks.stage, then flush): a read between two writes
  would make MLX copy the whole pool.
"""

import mlx.core as mx

from tiny_llm_base.memory import check_fits, kv_bytes_per_position

from .block_pool import blocks_needed


def check_pool_fits(model, positions: int, kv_dtype: str = "float32") -> None:
    """Refuse a pool of `positions` positions that could not fit in this machine's
    memory, before MLX tries (an allocation past it can crash the process). Bytes
    per position come from the model's layers (and kv_dtype); a model that does not
    show its layers is checked at the pool's first write."""
    per_position = kv_bytes_per_position(model, kv_dtype=kv_dtype)
    if per_position is not None:
        check_memory(positions * per_position, positions)


def check_memory(needed: int, positions: int) -> None:
    """ValueError, with the numbers, when `needed` bytes for a pool of `positions`
    positions pass what the machine has."""
    check_fits(
        needed,
        f"a KV pool of {positions:,} positions",
        "lower kv_memory (or num_blocks) or block_size",
    )


class LayerBlocks:
    """One layer's pool: keys and values [capacity, H, block_size, D].

    The arrays are made at the first write (when H, D and the dtype are known) and
    grow, doubling from FIRST_POSITIONS positions up to num_blocks blocks, to cover
    the highest block id written: memory follows the blocks the BlockPool has
    handed out (lowest ids first), not the budget. Writes are staged (stage) and
    written together (flush) before anything is read, so a step writes each layer's
    pool once, in place.
    """

    FIRST_POSITIONS = 256

    def __init__(self, num_blocks: int, block_size: int):
        raise NotImplementedError(
            "Week 3 Day 2 Task 2: LayerBlocks: keep num_blocks and block_size; keys "
            "and values None until the first write; nothing staged"
        )

    @property
    def capacity(self) -> int:
        """The blocks the arrays hold now (0 before the first write)."""
        return 0 if self.keys is None else self.keys.shape[0]

    def stage(
        self, blocks: list[int], slots: list[int], keys: mx.array, values: mx.array
    ) -> None:
        """Hold keys/values [n, H, D] for row i's position: slot slots[i] of block
        blocks[i]. Nothing is written until flush()."""
        raise NotImplementedError(
            "Week 3 Day 2 Task 2: stage: append (blocks, slots, keys, values) to staged"
        )

    def flush(self) -> None:
        """Write everything staged in ONE scatter per array, growing the arrays first
        if a block id is past them. Nothing staged: nothing to do."""
        raise NotImplementedError(
            "Week 3 Day 2 Task 2: flush: concatenate the staged blocks, slots, keys "
            "and values; grow to cover max(blocks) + 1; pool[blocks[:, None], "
            "mx.arange(H)[None, :], slots[:, None]] = rows for keys and values; "
            "nothing staged afterwards"
        )

    def grow(self, blocks: int, H: int, D: int, dtype: mx.Dtype) -> None:
        """Arrays of at least `blocks` blocks: the capacity doubles (from
        FIRST_POSITIONS positions' worth, at most num_blocks) and the old arrays are
        copied in. The first growth checks that the whole budget could fit the
        machine (check_memory). More than num_blocks blocks is a bug in the caller:
        ValueError "block {blocks - 1} is past the pool's {num_blocks} blocks"."""
        raise NotImplementedError(
            "Week 3 Day 2 Task 2: grow: nothing to do when blocks <= capacity; "
            "ValueError past num_blocks (the docstring's words); else the first time "
            "check_memory(2 x num_blocks x block_size x H x D x dtype.size bytes, "
            "num_blocks x block_size positions); new capacity max(blocks, 2 x "
            "capacity, blocks_needed(FIRST_POSITIONS, block_size)), at most "
            "num_blocks; concatenate zeros after the old arrays"
        )

    def gather(self, tables: list[list[int]], length: int) -> tuple[mx.array, mx.array]:
        """Keys and values [B, H, length, D] of B requests, each read through its
        block table (staged writes are flushed first). A table shorter than the
        others is padded with block 0: the caller's mask must hide those positions.
        """
        raise NotImplementedError(
            "Week 3 Day 2 Task 2: gather: flush(); cut or pad every table to "
            "ceil(length / block_size) blocks (a table may hold blocks reserved past "
            "length; pad with block 0); index the pool with the [B, 1, width] table "
            "array and the [1, H, 1] heads -> [B, H, width, block_size, D], decode() "
            "those blocks, reshape to [B, H, width * block_size, D] and cut to length"
        )

    def decode(self, stored: mx.array) -> mx.array:
        """Stored rows [..., D] as attention reads them: here as they are (a pool in
        fewer bytes, QuantizedLayerBlocks, decodes them)."""
        return stored
