"""A paged KV cache: keys and values live in fixed-size blocks of one shared pool.

A dense cache gives every decode slot max_seq_len positions up front. Here a layer's
storage is a pool of blocks, keys and values `[num_blocks, H, block_size, D]`, and a
request holds a *block table*: the ids of its blocks, in position order. Position p
of a request lives in block `table[p // block_size]`, at `p % block_size`. A request
takes blocks as it grows and gives them back when it ends, so memory follows the
tokens actually held (vLLM's PagedAttention).

    block table [7, 2, 9]    block_size 4, offset 10
    positions   0-3 -> block 7,  4-7 -> block 2,  8-9 -> block 9 (2 of 4 used)

Block ids are the same in every layer: one BlockPool does the bookkeeping (a free
list and a reference count per block) for all of them, and each layer keeps its
arrays in a LayerBlocks. A PagedKvCache is one request's view of one layer (the
model calls it like TinyKvFullCache); a PagedBatchingKvCache holds the decode rows'
views (the engine calls it like BatchingKvCache). Attention reads a request's keys
by gathering its blocks in table order.

Prefix caching (week 3 day 3): a full block is named by a hash chained over its
parent's hash and its own token ids, so equal hashes mean equal tokens from position
0 on, hence equal keys and values. The pool remembers hashed blocks; a new request
whose prompt starts with cached blocks shares them (refcount + 1) instead of
computing them. A hashed block that no request holds stays cached, least recently
used first out, until the free list runs dry.
"""

import hashlib
from array import array
from collections import OrderedDict, deque
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
        "lower num_blocks or block_size",
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

    refcounts[b]: the requests holding block b. A block held by nobody is either
    free (in `free`) or cached (in `cached`, hashed, least recently used first).
    hash_of / block_of: a cached-or-held hashed block's name, both ways.
    peak_in_use: the most blocks held at once, raised wherever a block is taken
    (allocate, lookup): blocks a step takes and gives back before it ends count too.
    """

    def __init__(self, num_blocks: int, block_size: int):
        raise NotImplementedError(
            "Week 3 Day 2: BlockPool: keep num_blocks and block_size; every block "
            "free (a deque 0 .. num_blocks - 1) with refcount 0; no cached blocks (an"
            " OrderedDict) and no names (hash_of, block_of: empty dicts); peak_in_use"
            " 0"
        )

    @property
    def available(self) -> int:
        """Blocks allocate() can hand out: the free ones and the cached ones."""
        raise NotImplementedError(
            "Week 3 Day 2: available: free blocks + cached blocks"
        )

    @property
    def in_use(self) -> int:
        """Blocks some request holds."""
        raise NotImplementedError("Week 3 Day 2: in_use: num_blocks - available")

    def allocate(self, count: int) -> list[int]:
        """`count` blocks, each with refcount 1. Free blocks go first; then the least
        recently used cached blocks, which forget their hash. ValueError when fewer
        than `count` are available (check `available` first)."""
        raise NotImplementedError(
            "Week 3 Day 2: allocate: ValueError if count > available; else pop blocks"
            " from the front of the free list (day 3: when it is empty, the least "
            "recently used cached block, forgetting its name in hash_of and "
            "block_of), each with refcount 1; then raise peak_in_use to in_use"
        )

    def release(self, blocks: list[int]) -> None:
        """Each block's refcount - 1; a block nobody holds any more becomes cached
        (most recently used) if hashed, else free. `blocks` come in table order and
        are given back last to first, so a chain's tail is evicted before its root:
        without its root block, the rest of a chain can never be found."""
        raise NotImplementedError(
            "Week 3 Day 2: release: refcount - 1 per block, last to first; at 0 the "
            "block goes to the end of the free list (day 3: into `cached`, most "
            "recently used, if it has a name)"
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
    """One layer's pool: keys and values [num_blocks, H, block_size, D], made at the
    first write (when H, D and the dtype are known)."""

    def __init__(self, num_blocks: int, block_size: int):
        raise NotImplementedError(
            "Week 3 Day 2: LayerBlocks: keep num_blocks and block_size; keys and "
            "values None until the first write"
        )

    def write(
        self,
        tables: list[list[int]],
        positions: list[int],
        keys: mx.array,
        values: mx.array,
    ) -> None:
        """Store keys/values [n, H, D]: row i at position positions[i] of the request
        whose blocks are tables[i]."""
        raise NotImplementedError(
            "Week 3 Day 2: write: make keys/values mx.zeros((num_blocks, H, "
            "block_size, D)) at the first write, after check_memory(2 x num_blocks x "
            "block_size x H x D x keys.dtype.size bytes, num_blocks x block_size "
            "positions); position p of table t is block t[p // block_size], slot p % "
            "block_size; scatter all n rows at once: pool[blocks[:, None], "
            "mx.arange(H)[None, :], slots[:, None]] = rows"
        )

    def gather(self, tables: list[list[int]], length: int) -> tuple[mx.array, mx.array]:
        """Keys and values [B, H, length, D] of B requests, each read through its
        block table. A table shorter than the others is padded with block 0: the
        caller's mask must hide those positions."""
        raise NotImplementedError(
            "Week 3 Day 2: gather: pad every table to ceil(length / block_size) "
            "blocks with block 0, index the pool with the [B, width] table array -> "
            "[B, width, H, block_size, D], move the heads before the blocks, reshape "
            "to [B, H, width * block_size, D] and cut to length"
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

    def update_and_fetch(
        self, keys: mx.array, values: mx.array
    ) -> tuple[mx.array, mx.array, str | None]:
        """keys/values: [1, H, L, D] at positions offset .. offset + L - 1. Returns all
        keys/values [1, H, offset + L, D] and the mask ("causal", or None for L = 1)."""
        raise NotImplementedError(
            "Week 3 Day 2: update_and_fetch: check_room(offset + L), write the L new "
            "keys/values ([L, H, D]) at positions offset .. offset + L - 1, offset +="
            " L, then gather the table's first offset positions; mask 'causal' for L "
            "> 1 else None"
        )


class PagedBatchingKvCache(TinyKvCache):
    """One layer's decode rows, like BatchingKvCache, but a slot holds a request's
    PagedKvCache instead of a copy of its keys: moving a prefilled request into a
    slot copies nothing.

    slots: max_active_requests entries, the PagedKvCache in row i or None. The
    layer's LayerBlocks is reached through a slot's view, so a step with no
    occupied row has nothing to write to: update_and_fetch raises ValueError.
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

    def update_and_fetch(
        self, keys: mx.array, values: mx.array
    ) -> tuple[mx.array, mx.array, mx.array]:
        """keys/values: [B, H, L, D], row b written at its request's offset (an empty
        row's are dropped). Returns keys/values [B, H, S, D], S = the longest row's
        offset + L, and the mask [B, 1, L, S] from each row's offset."""
        raise NotImplementedError(
            "Week 3 Day 2: update_and_fetch: check rows <= B <= max_active_requests "
            "and S = max(offsets) + L <= max_seq_len as BatchingKvCache does; write "
            "the occupied rows' tokens through their tables in ONE write, advance "
            "their offsets, gather every row's table to S positions (an empty row: an"
            " empty table) and build the mask from the offsets before the step "
            "(batch_causal_mask)"
        )
