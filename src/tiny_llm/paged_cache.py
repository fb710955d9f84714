"""A paged KV cache: keys and values live in fixed-size blocks of one shared pool.

A dense cache gives every decode slot max_seq_len positions up front. Here a layer's
storage is a pool of blocks, keys and values `[blocks, H, block_size, D]`, and a
request holds a *block table*: the ids of its blocks, in position order. Position p
of a request lives in block `table[p // block_size]`, at `p % block_size`. A request
takes blocks as its steps need them and gives them back when it ends, so memory
follows the tokens actually held (vLLM's PagedAttention).

    block table [7, 2, 9]    block_size 4, offset 10
    positions   0-3 -> block 7,  4-7 -> block 2,  8-9 -> block 9 (2 of 4 used)

Block ids are the same in every layer: one BlockPool does the bookkeeping (which
ids are free, a reference count per block) for all of them, and each layer keeps its
arrays in a LayerBlocks. A PagedKvCache is one request's view of one layer (the
model calls it like TinyKvFullCache); a PagedBatchingKvCache holds the decode rows'
views (the engine calls it like BatchingKvCache). Attention reads a request's keys
by gathering its blocks in table order.

Two rules make the pool cost what the tokens cost, not what the pool could hold:
- Memory: num_blocks is a budget, not an allocation. The pool hands out the lowest
  ids first and a new id only when no given-back block can be reused, and a layer's
  arrays grow (doubling, up to num_blocks) to cover the highest id written.
- Time: an MLX array is a value; `pool[idx] = x` writes in place only when nothing
  else still needs the old pool. A step with several parts (week 3 day 1's mixed
  step) therefore *stages* every part's keys first and writes them in ONE scatter
  before any part reads (LayerBlocks.stage, then flush): a read between two writes
  would make MLX copy the whole pool.

Prefix caching (week 3 day 3): a full block is named by a hash chained over its
parent's hash and its own token ids, so equal hashes mean equal tokens from position
0 on, hence equal keys and values. The pool remembers hashed blocks; a new request
whose prompt starts with cached blocks shares them (refcount + 1) instead of
computing them. A hashed block that no request holds stays cached, least recently
used first out, until a block is needed and none was given back.
"""

import hashlib
from array import array
import heapq
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

import mlx.core as mx

from tiny_llm_base.memory import check_fits, kv_bytes_per_position

from .kv_cache import TinyKvCache, batch_causal_mask


def blocks_needed(tokens: int, block_size: int) -> int:
    """The blocks that hold `tokens` positions: ceil(tokens / block_size)."""
    raise NotImplementedError(
        "Week 3 Day 2: blocks_needed: ceil(tokens / block_size), in integers"
    )


def chain_hash(parent: bytes | None, tokens: Sequence[int]) -> bytes:
    """A full block's name: SHA-256 over its parent block's hash (None for the first
    block) and its token ids. Equal names mean equal tokens at every position before
    the block's end (a collision would need a broken SHA-256)."""
    raise NotImplementedError(
        "Week 3 Day 3: chain_hash: hashlib.sha256 fed the parent hash (b'' for None),"
        " then the token ids as bytes (array('q', tokens).tobytes()); its digest()"
    )


def check_pool_fits(model, positions: int) -> None:
    """Refuse a pool of `positions` positions that could not fit in this machine's
    memory, before MLX tries (an allocation past it can crash the process). Bytes
    per position come from the model's layers; a model that does not show its
    layers is checked at the pool's first write."""
    per_position = kv_bytes_per_position(model)
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


@dataclass
class BlockTable:
    """One request's blocks, shared by every layer.

    blocks: block ids in position order. hashes: chain hashes of its first
    len(hashes) blocks, each full (the next block's parent)."""

    blocks: list[int] = field(default_factory=list)
    hashes: list[bytes] = field(default_factory=list)


class BlockPool:
    """Block ids 0 .. num_blocks - 1: who holds which, and which full blocks are cached.

    high_water: ids 0 .. high_water - 1 have been handed out at some time; the ids
    above were never used, and the layers' arrays need not cover them yet.
    refcounts[b] (b < high_water): the requests holding block b. A block held by
    nobody is either free (in `free`, a heap: lowest id first) or cached (in
    `cached`, hashed, least recently used first).
    hash_of / block_of: a cached-or-held hashed block's name, both ways.
    peak_in_use: the most blocks held at once, raised wherever a block is taken
    (allocate, lookup): blocks a step takes and gives back before it ends count too.
    """

    def __init__(self, num_blocks: int, block_size: int):
        raise NotImplementedError(
            "Week 3 Day 2: BlockPool: keep num_blocks and block_size; high_water 0, "
            "no free ids (a list used as a heap), no refcounts; no cached blocks (an "
            "OrderedDict) and no names (hash_of, block_of: empty dicts); peak_in_use "
            "0"
        )

    @property
    def available(self) -> int:
        """Blocks allocate() can hand out: free, cached, or never used."""
        raise NotImplementedError(
            "Week 3 Day 2: available: free + cached + the ids above high_water"
        )

    @property
    def in_use(self) -> int:
        """Blocks some request holds."""
        raise NotImplementedError("Week 3 Day 2: in_use: num_blocks - available")

    def allocate(self, count: int) -> list[int]:
        """`count` blocks, each with refcount 1. A given-back block is reused before
        the pool takes more memory: the lowest free id first, then (day 3) the least
        recently used cached block, which forgets its name, and only then a new id at
        high_water. ValueError when fewer than `count` are available (check
        `available` first)."""
        raise NotImplementedError(
            "Week 3 Day 2: allocate: ValueError if count > available; else for each "
            "block pop the lowest free id (heapq), or (day 3) evict the least "
            "recently used cached block, forgetting its name in hash_of and block_of,"
            " or take id high_water (high_water + 1, a new refcount); refcount 1; "
            "then raise peak_in_use to in_use"
        )

    def release(self, blocks: list[int]) -> None:
        """Each block's refcount - 1; a block nobody holds any more becomes cached
        (most recently used) if hashed, else free. `blocks` come in table order and
        are given back last to first, so a chain's tail is evicted before its root:
        without its root block, the rest of a chain can never be found."""
        raise NotImplementedError(
            "Week 3 Day 2: release: refcount - 1 per block, last to first; at 0 the "
            "block goes on the free heap (day 3: into `cached`, most recently used, "
            "if it has a name)"
        )

    def lookup(self, tokens: Sequence[int]) -> BlockTable:
        """The longest chain of cached full blocks that starts `tokens`, each block's
        refcount raised (a cached one is no longer evictable): a BlockTable of them
        and their hashes. Only full blocks of `tokens` count."""
        raise NotImplementedError(
            "Week 3 Day 3: lookup: walk the full blocks of tokens, chaining "
            "chain_hash from None; stop at the first name block_of lacks; for each "
            "found block raise its refcount, take it out of `cached`, and add it and "
            "its hash to a new BlockTable; then raise peak_in_use to in_use"
        )

    def remember(self, block: int, block_hash: bytes) -> None:
        """Name a full block so later requests can find it. A name already taken (a
        block computed twice, by requests that ran side by side) keeps its first
        block: this one stays unnamed, and is freed when its request ends."""
        raise NotImplementedError(
            "Week 3 Day 3: remember: unless the hash or the block already has a name,"
            " record block_of[hash] = block and hash_of[block] = hash"
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
            "Week 3 Day 2: LayerBlocks: keep num_blocks and block_size; keys and "
            "values None until the first write; nothing staged"
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
            "Week 3 Day 2: stage: append (blocks, slots, keys, values) to staged"
        )

    def flush(self) -> None:
        """Write everything staged in ONE scatter per array, growing the arrays first
        if a block id is past them. Nothing staged: nothing to do."""
        raise NotImplementedError(
            "Week 3 Day 2: flush: concatenate the staged blocks, slots, keys and "
            "values; grow to cover max(blocks) + 1; pool[blocks[:, None], "
            "mx.arange(H)[None, :], slots[:, None]] = rows for keys and values; "
            "nothing staged afterwards"
        )

    def grow(self, blocks: int, H: int, D: int, dtype: mx.Dtype) -> None:
        """Arrays of at least `blocks` blocks: the capacity doubles (from
        FIRST_POSITIONS positions' worth, at most num_blocks) and the old arrays are
        copied in. The first growth checks that the whole budget could fit the
        machine (check_memory)."""
        raise NotImplementedError(
            "Week 3 Day 2: grow: nothing to do when blocks <= capacity; else the "
            "first time check_memory(2 x num_blocks x block_size x H x D x dtype.size"
            " bytes, num_blocks x block_size positions); new capacity max(blocks, 2 x"
            " capacity, blocks_needed(FIRST_POSITIONS, block_size)), at most "
            "num_blocks; concatenate zeros after the old arrays"
        )

    def gather(self, tables: list[list[int]], length: int) -> tuple[mx.array, mx.array]:
        """Keys and values [B, H, length, D] of B requests, each read through its
        block table (staged writes are flushed first). A table shorter than the
        others is padded with block 0: the caller's mask must hide those positions.
        """
        raise NotImplementedError(
            "Week 3 Day 2: gather: flush(); pad every table to ceil(length / "
            "block_size) blocks with block 0, index the pool with the [B, width] "
            "table array -> [B, width, H, block_size, D], move the heads before the "
            "blocks, reshape to [B, H, width * block_size, D] and cut to length"
        )


class PagedKvCache(TinyKvCache):
    """One request's cache in one layer: its BlockTable into the layer's LayerBlocks.

    offset: tokens this layer holds for the request (it may start above 0 when a
    cached prefix was shared). The table must already hold the blocks a step writes
    to: the engine reserves them before the forward.
    """

    def __init__(self, layer: LayerBlocks, table: BlockTable, offset: int = 0):
        raise NotImplementedError(
            "Week 3 Day 2: PagedKvCache: keep the layer's LayerBlocks, the request's "
            "BlockTable and offset"
        )

    @property
    def keys(self) -> mx.array | None:
        raise NotImplementedError(
            "Week 3 Day 2: keys: the layer's pool of keys (layer.keys)"
        )

    @property
    def values(self) -> mx.array | None:
        raise NotImplementedError(
            "Week 3 Day 2: values: the layer's pool of values (layer.values)"
        )

    def check_room(self, end: int) -> None:
        raise NotImplementedError(
            "Week 3 Day 2: check_room: ValueError unless positions 0 .. end - 1 fit "
            "the table's blocks (len(blocks) * block_size), saying to reserve blocks "
            "before the forward"
        )

    def stage(self, keys: mx.array, values: mx.array) -> None:
        """keys/values: [1, H, L, D] at positions offset .. offset + L - 1, staged in
        the layer (written at the next read); offset += L."""
        raise NotImplementedError(
            "Week 3 Day 2: stage: check_room(offset + L); stage rows [L, H, D] in the"
            " layer at each position's block and slot; remember L; offset += L"
        )

    def fetch_staged(self) -> tuple[mx.array, mx.array, str | None]:
        """All keys/values [1, H, offset, D] and the mask of the staged step
        ("causal", or None for L = 1)."""
        raise NotImplementedError(
            "Week 3 Day 2: fetch_staged: gather the table's first offset positions; "
            "mask 'causal' when the staged L > 1 else None"
        )

    def update_and_fetch(
        self, keys: mx.array, values: mx.array
    ) -> tuple[mx.array, mx.array, str | None]:
        """keys/values: [1, H, L, D] at positions offset .. offset + L - 1. Returns all
        keys/values [1, H, offset + L, D] and the mask ("causal", or None for L = 1)."""
        self.stage(keys, values)
        return self.fetch_staged()


class PagedBatchingKvCache(TinyKvCache):
    """One layer's decode rows, like BatchingKvCache, but a slot holds a request's
    PagedKvCache instead of a copy of its keys: moving a prefilled request into a
    slot copies nothing.

    slots: max_active_requests entries, the PagedKvCache in row i or None. The
    layer's LayerBlocks is reached through a slot's view, so a step with no
    occupied row has nothing to write to: stage raises ValueError.
    """

    def __init__(self, max_active_requests: int, max_seq_len: int):
        raise NotImplementedError(
            "Week 3 Day 2: PagedBatchingKvCache: keep max_active_requests and "
            "max_seq_len; every slot None"
        )

    @property
    def offset(self) -> list[int]:
        raise NotImplementedError(
            "Week 3 Day 2: offset: each slot's view's offset, 0 for an empty slot"
        )

    @property
    def rows(self) -> int:
        """The highest slot in use + 1 (0 when empty): the rows a step must feed."""
        raise NotImplementedError(
            "Week 3 Day 2: rows: the highest occupied slot + 1, 0 when empty"
        )

    def add_request(self, prefilled: PagedKvCache, slot: int) -> None:
        """Row `slot` reads and writes through the request's own block table."""
        raise NotImplementedError(
            "Week 3 Day 2: add_request: ValueError for a slot outside [0, "
            "max_active_requests) or in use; else the slot holds the request's "
            "PagedKvCache (nothing is copied)"
        )

    def remove_request(self, slot: int) -> None:
        """Row `slot` is empty again; the request's blocks are the engine's to release."""
        raise NotImplementedError("Week 3 Day 2: remove_request: the slot holds None")

    def row_view(self, slot: int, offset: int) -> PagedKvCache:
        """Row `slot` as one sequence's cache from position `offset` on (week 3 day
        4's draft tokens): a second view of the request's blocks, so the row's own
        count is left as it is until set_offset."""
        raise NotImplementedError(
            "Week 3 Day 4: row_view: a PagedKvCache over the slot's layer and table, "
            "at offset"
        )

    def set_offset(self, slot: int, offset: int) -> None:
        """Row `slot` holds exactly `offset` positions from now on."""
        raise NotImplementedError(
            "Week 3 Day 4: set_offset: the slot's view's offset = offset"
        )

    def stage(self, keys: mx.array, values: mx.array) -> None:
        """keys/values: [B, H, L, D]: each occupied row's L tokens staged through its
        own view at its offset (an empty row's are dropped); the offsets before the
        step are kept for the mask."""
        raise NotImplementedError(
            "Week 3 Day 2: stage: check rows <= B <= max_active_requests and S = "
            "max(offsets) + L <= max_seq_len as BatchingKvCache does, and that some "
            "row is occupied and has room (check_room) before staging any; keep the "
            "offsets before the step; stage keys[b:b+1] through each occupied row's "
            "view"
        )

    def fetch_staged(self) -> tuple[mx.array, mx.array, mx.array]:
        """keys/values [B, H, S, D], S = the longest row's offset before the step +
        L, every row read through its table (an empty row: an empty table), and the
        mask [B, 1, L, S] from the offsets before the step."""
        raise NotImplementedError(
            "Week 3 Day 2: fetch_staged: gather every row's table to S positions "
            "through the layer of an occupied view; batch_causal_mask from the kept "
            "offsets"
        )

    def update_and_fetch(
        self, keys: mx.array, values: mx.array
    ) -> tuple[mx.array, mx.array, mx.array]:
        """keys/values: [B, H, L, D], row b written at its request's offset (an empty
        row's are dropped). Returns keys/values [B, H, S, D], S = the longest row's
        offset + L, and the mask [B, 1, L, S] from each row's offset."""
        self.stage(keys, values)
        return self.fetch_staged()
