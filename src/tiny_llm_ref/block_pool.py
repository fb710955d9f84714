"""Week 3 days 2 and 3: the block pool, the bookkeeping of a paged KV cache.

A request holds a *block table*: the ids of its blocks, in position order. Position p
of a request lives in block `table[p // block_size]`, at `p % block_size`. A request
takes blocks as its steps need them and gives them back when it ends, so memory
follows the tokens actually held (vLLM's PagedAttention).

    block table [7, 2, 9]    block_size 4, offset 10
    positions   0-3 -> block 7,  4-7 -> block 2,  8-9 -> block 9 (2 of 4 used)

Block ids are the same in every layer: one BlockPool keeps, for all of them, which
ids are free and a reference count per block; the layers' arrays are layer_blocks.py.
num_blocks is a budget, not an allocation: the pool hands out the lowest ids first,
and a new id only when no given-back block can be reused.

Prefix caching (day 3): a full block is named by a hash chained over its parent's
hash and its own token ids, so equal hashes mean equal tokens from position 0 on,
hence equal keys and values. The pool remembers hashed blocks; a new request whose
prompt starts with cached blocks shares them (refcount + 1) instead of computing
them. A hashed block that no request holds stays cached, least recently used first
out, until a block is needed and none was given back.
"""

import hashlib
import heapq
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field


def blocks_needed(tokens: int, block_size: int) -> int:
    """The blocks that hold `tokens` positions: ceil(tokens / block_size)."""
    # Week 3 Day 2 Task 1: blocks_needed: ceil(tokens / block_size), in integers
    return -(-tokens // block_size)


def chain_hash(parent: bytes | None, tokens: Sequence[int]) -> bytes:
    """A full block's name: SHA-256 over its parent block's hash (None for the first
    block) and its token ids. Equal names mean equal tokens at every position before
    the block's end (a collision would need a broken SHA-256)."""
    # Week 3 Day 3 Task 1: chain_hash: hashlib.sha256 fed the parent hash (b'' for
    # None), then the token ids as bytes (array('q', tokens).tobytes()); its digest()
    digest = hashlib.sha256(parent or b"")
    digest.update(array("q", tokens).tobytes())
    return digest.digest()


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
        # Week 3 Day 2 Task 1: BlockPool: keep num_blocks and block_size; high_water 0,
        # no free ids (a list used as a heap), no refcounts; no cached blocks (an
        # OrderedDict keyed by block id, least recently used first) and no names
        # (hash_of, block_of: empty dicts); peak_in_use 0
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.high_water = 0
        self.free: list[int] = []
        self.refcounts: list[int] = []
        self.cached: OrderedDict[int, None] = OrderedDict()
        self.hash_of: dict[int, bytes] = {}
        self.block_of: dict[bytes, int] = {}
        self.peak_in_use = 0

    @property
    def available(self) -> int:
        """Blocks allocate() can hand out: free, cached, or never used."""
        # Week 3 Day 2 Task 1: available: free + cached + the ids above high_water
        return len(self.free) + len(self.cached) + self.num_blocks - self.high_water

    @property
    def in_use(self) -> int:
        """Blocks some request holds."""
        # Week 3 Day 2 Task 1: in_use: num_blocks - available
        return self.num_blocks - self.available

    def allocate(self, count: int) -> list[int]:
        """`count` blocks, each with refcount 1. A given-back block is reused before
        the pool takes more memory: the lowest free id first, then (day 3) the least
        recently used cached block, which forgets its name, and only then a new id at
        high_water. ValueError when fewer than `count` are available (check
        `available` first, take nothing): "{count} blocks asked, {available}
        available: check available first, or preempt a request"."""
        # Week 3 Day 2 Task 1: allocate: ValueError if count > available; else for each
        # block pop the lowest free id (heapq), or (day 3) evict the least recently used
        # cached block, forgetting its name in hash_of and block_of, or take id
        # high_water (high_water + 1, a new refcount); refcount 1; then raise
        # peak_in_use to in_use
        if count > self.available:
            raise ValueError(
                f"{count} blocks asked, {self.available} available: check available "
                "first, or preempt a request"
            )
        blocks = []
        for _ in range(count):
            if self.free:
                block = heapq.heappop(self.free)
            elif self.cached:
                block, _ = self.cached.popitem(last=False)  # least recently used
                del self.block_of[self.hash_of.pop(block)]
            else:
                block = self.high_water
                self.high_water += 1
                self.refcounts.append(0)
            self.refcounts[block] = 1
            blocks.append(block)
        self.peak_in_use = max(self.peak_in_use, self.in_use)
        return blocks

    def release(self, blocks: list[int]) -> None:
        """Each block's refcount - 1; a block nobody holds any more becomes cached
        (most recently used) if hashed, else free. `blocks` come in table order and
        are given back last to first, so a chain's tail is evicted before its root:
        without its root block, the rest of a chain can never be found."""
        # Week 3 Day 2 Task 1: release: refcount - 1 per block, last to first; at 0 the
        # block goes on the free heap (day 3: into `cached`, most recently used, if it
        # has a name)
        for block in reversed(blocks):
            self.refcounts[block] -= 1
            if self.refcounts[block] == 0:
                if block in self.hash_of:
                    self.cached[block] = None
                else:
                    heapq.heappush(self.free, block)

    def share(self, blocks: list[int]) -> list[int]:
        """Held blocks get one more holder each (refcount + 1); returns them."""
        # Week 3 Day 2 Task 1: share: refcount + 1 for each block; return the list
        for block in blocks:
            self.refcounts[block] += 1
        return blocks

    def lookup(self, tokens: Sequence[int]) -> BlockTable:
        """The longest chain of cached full blocks that starts `tokens`, each block's
        refcount raised (a cached one is no longer evictable): a BlockTable of them
        and their hashes. Only full blocks of `tokens` count."""
        # Week 3 Day 3 Task 1: lookup: walk the full blocks of tokens, chaining
        # chain_hash from None; stop at the first name block_of lacks; for each found
        # block raise its refcount, take it out of `cached`, and add it and its hash to
        # a new BlockTable; then raise peak_in_use to in_use
        table = BlockTable()
        size = self.block_size
        parent = None
        for start in range(0, len(tokens) - size + 1, size):
            parent = chain_hash(parent, tokens[start : start + size])
            block = self.block_of.get(parent)
            if block is None:
                break
            self.refcounts[block] += 1
            self.cached.pop(block, None)
            table.blocks.append(block)
            table.hashes.append(parent)
        self.peak_in_use = max(self.peak_in_use, self.in_use)
        return table

    def remember(self, block: int, block_hash: bytes) -> None:
        """Name a full block so later requests can find it. A name already taken (a
        block computed twice, by requests that ran side by side) keeps its first
        block: this one stays unnamed, and is freed when its request ends."""
        # Week 3 Day 3 Task 1: remember: unless the hash or the block already has a
        # name, record block_of[hash] = block and hash_of[block] = hash
        if block_hash not in self.block_of and block not in self.hash_of:
            self.block_of[block_hash] = block
            self.hash_of[block] = block_hash
