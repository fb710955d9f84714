"""Week 3 day 2: a paged KV cache's storage: keys and values in fixed-size blocks of
one shared pool (block_pool.py keeps the ids and their tables).

A dense cache gives every decode slot max_seq_len positions up front. Here a layer's
storage is a pool of blocks, keys and values `[blocks, H, block_size, D]`, and each
layer keeps its arrays in a LayerBlocks. A PagedKvCache is one request's view of one
layer (the model calls it like TinyKvFullCache); a PagedBatchingKvCache holds the
decode rows' views (the engine calls it like BatchingKvCache). Attention reads a
request's keys by gathering its blocks in table order.

Two rules make the pool cost what the tokens cost, not what the pool could hold:
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

from .block_pool import BlockTable, blocks_needed
from .kv_cache import TinyKvCache, batch_causal_mask


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
        # Week 3 Day 2: LayerBlocks: keep num_blocks and block_size; keys and values
        # None until the first write; nothing staged
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.keys: mx.array | None = None
        self.values: mx.array | None = None
        self.staged: list[tuple[list[int], list[int], mx.array, mx.array]] = []

    @property
    def capacity(self) -> int:
        """The blocks the arrays hold now (0 before the first write)."""
        return 0 if self.keys is None else self.keys.shape[0]

    def stage(
        self, blocks: list[int], slots: list[int], keys: mx.array, values: mx.array
    ) -> None:
        """Hold keys/values [n, H, D] for row i's position: slot slots[i] of block
        blocks[i]. Nothing is written until flush()."""
        # Week 3 Day 2: stage: append (blocks, slots, keys, values) to staged
        self.staged.append((blocks, slots, keys, values))

    def flush(self) -> None:
        """Write everything staged in ONE scatter per array, growing the arrays first
        if a block id is past them. Nothing staged: nothing to do."""
        # Week 3 Day 2: flush: concatenate the staged blocks, slots, keys and values;
        # grow to cover max(blocks) + 1; pool[blocks[:, None], mx.arange(H)[None, :],
        # slots[:, None]] = rows for keys and values; nothing staged afterwards
        if not self.staged:
            return
        blocks = [b for staged in self.staged for b in staged[0]]
        slots = [s for staged in self.staged for s in staged[1]]
        keys = mx.concatenate([staged[2] for staged in self.staged])
        values = mx.concatenate([staged[3] for staged in self.staged])
        self.staged = []
        _, H, D = keys.shape
        self.grow(max(blocks) + 1, H, D, keys.dtype)
        index = (
            mx.array(blocks)[:, None],
            mx.arange(H)[None, :],
            mx.array(slots)[:, None],
        )
        self.keys[index] = keys
        self.values[index] = values

    def grow(self, blocks: int, H: int, D: int, dtype: mx.Dtype) -> None:
        """Arrays of at least `blocks` blocks: the capacity doubles (from
        FIRST_POSITIONS positions' worth, at most num_blocks) and the old arrays are
        copied in. The first growth checks that the whole budget could fit the
        machine (check_memory). More than num_blocks blocks is a bug in the caller:
        ValueError "block {blocks - 1} is past the pool's {num_blocks} blocks"."""
        # Week 3 Day 2: grow: nothing to do when blocks <= capacity; ValueError past
        # num_blocks (the docstring's words); else the first
        # time check_memory(2 x num_blocks x block_size x H x D x dtype.size bytes,
        # num_blocks x block_size positions); new capacity max(blocks, 2 x capacity,
        # blocks_needed(FIRST_POSITIONS, block_size)), at most num_blocks;
        # concatenate zeros after the old arrays
        if blocks <= self.capacity:
            return
        if blocks > self.num_blocks:
            raise ValueError(
                f"block {blocks - 1} is past the pool's {self.num_blocks} blocks"
            )
        if self.keys is None:
            positions = self.num_blocks * self.block_size
            check_memory(2 * positions * H * D * dtype.size, positions)
        first = blocks_needed(self.FIRST_POSITIONS, self.block_size)
        capacity = min(self.num_blocks, max(blocks, 2 * self.capacity, first))
        extra = mx.zeros((capacity - self.capacity, H, self.block_size, D), dtype)
        if self.keys is None:
            self.keys, self.values = extra, mx.zeros_like(extra)
        else:
            self.keys = mx.concatenate([self.keys, extra])
            self.values = mx.concatenate([self.values, extra])

    def gather(self, tables: list[list[int]], length: int) -> tuple[mx.array, mx.array]:
        """Keys and values [B, H, length, D] of B requests, each read through its
        block table (staged writes are flushed first). A table shorter than the
        others is padded with block 0: the caller's mask must hide those positions.
        """
        # Week 3 Day 2: gather: flush(); cut or pad every table to ceil(length /
        # block_size) blocks (a table may hold blocks reserved past length; pad with
        # block 0), index the pool with the [B, width] table array -> [B,
        # width, H, block_size, D], move the heads before the blocks, reshape to [B, H,
        # width * block_size, D] and cut to length
        self.flush()
        width = blocks_needed(length, self.block_size)
        padded = mx.array([(t + [0] * width)[:width] for t in tables])  # [B, width]

        def read(pool: mx.array) -> mx.array:
            blocks = pool[padded]  # [B, width, H, block_size, D]
            B, _, H, size, D = blocks.shape
            flat = blocks.transpose(0, 2, 1, 3, 4).reshape(B, H, width * size, D)
            return flat[:, :, :length, :]

        return read(self.keys), read(self.values)


class PagedKvCache(TinyKvCache):
    """One request's cache in one layer: its BlockTable into the layer's LayerBlocks.

    offset: tokens this layer holds for the request (it may start above 0 when a
    cached prefix was shared). The table must already hold the blocks a step writes
    to: the engine reserves them before the forward.
    """

    def __init__(self, layer: LayerBlocks, table: BlockTable, offset: int = 0):
        # Week 3 Day 2: PagedKvCache: keep the layer's LayerBlocks, the request's
        # BlockTable and offset
        self.layer = layer
        self.table = table
        self.offset = offset

    @property
    def keys(self) -> mx.array | None:
        # Week 3 Day 2: keys: the layer's pool of keys (layer.keys)
        return self.layer.keys

    @property
    def values(self) -> mx.array | None:
        # Week 3 Day 2: values: the layer's pool of values (layer.values)
        return self.layer.values

    def check_room(self, end: int) -> None:
        # Week 3 Day 2: check_room: ValueError unless positions 0 .. end - 1 fit the
        # table's blocks (len(blocks) * block_size), saying to reserve blocks before the
        # forward
        capacity = len(self.table.blocks) * self.layer.block_size
        if end > capacity:
            raise ValueError(
                f"position {end - 1} is past the request's {len(self.table.blocks)} "
                "blocks: reserve its blocks before the forward"
            )

    def stage(self, keys: mx.array, values: mx.array) -> None:
        """keys/values: [1, H, L, D] at positions offset .. offset + L - 1, staged in
        the layer (written at the next read); offset += L."""
        # Week 3 Day 2: stage: check_room(offset + L); stage rows [L, H, D] in the layer
        # at each position's block and slot; remember L; offset += L
        L = keys.shape[2]
        end = self.offset + L
        self.check_room(end)
        size = self.layer.block_size
        positions = range(self.offset, end)
        self.layer.stage(
            [self.table.blocks[p // size] for p in positions],
            [p % size for p in positions],
            keys[0].swapaxes(0, 1),
            values[0].swapaxes(0, 1),
        )
        self.staged_length = L
        self.offset = end

    def fetch_staged(self) -> tuple[mx.array, mx.array, str | None]:
        """All keys/values [1, H, offset, D] and the mask of the staged step
        ("causal", or None for L = 1)."""
        # Week 3 Day 2: fetch_staged: gather the table's first offset positions; mask
        # 'causal' when the staged L > 1 else None
        keys, values = self.layer.gather([self.table.blocks], self.offset)
        return keys, values, "causal" if self.staged_length > 1 else None

    def update_and_fetch(
        self, keys: mx.array, values: mx.array
    ) -> tuple[mx.array, mx.array, str | None]:
        """keys/values: [1, H, L, D] at positions offset .. offset + L - 1. Returns all
        keys/values [1, H, offset + L, D] and the mask ("causal", or None for L = 1)."""
        self.stage(keys, values)
        return self.fetch_staged()


# A separate attention call costs about as much as this many more positions in a
# call (a gather and cpu_attention of one decode row in one layer of the embedded
# model on the course's 2-core CPU: about 120 us plus 0.4 us a position).
CALL_POSITIONS = 256


def group_rows(
    lengths: list[int], call_positions: int = CALL_POSITIONS
) -> list[list[int]]:
    """The decode rows cut into groups that attend together, each row padded to its
    group's longest: lengths [B] -> lists of row indexes, each in row order.

    Rows are taken longest first; a row joins the group before it when that group's
    longest is at most call_positions positions longer, else it starts a group. So a
    row never pays for more than call_positions positions it does not hold, and
    rows of about one length share one call.
    """
    # Week 3 Day 2: group_rows: sort the row indexes by length, longest first; a row
    # whose length is within call_positions of its group's first (longest) row joins
    # it, else it starts a new group; each group's indexes sorted
    groups: list[list[int]] = []
    for b in sorted(range(len(lengths)), key=lambda b: -lengths[b]):
        if groups and lengths[groups[-1][0]] - lengths[b] <= call_positions:
            groups[-1].append(b)
        else:
            groups.append([b])
    return [sorted(rows) for rows in groups]


class PagedBatchingKvCache(TinyKvCache):
    """One layer's decode rows, like BatchingKvCache, but a slot holds a request's
    PagedKvCache instead of a copy of its keys: moving a prefilled request into a
    slot copies nothing.

    slots: max_active_requests entries, the PagedKvCache in row i or None. The
    layer's LayerBlocks is reached through a slot's view, so a step with no
    occupied row has nothing to write to: stage raises ValueError.
    """

    def __init__(self, max_active_requests: int, max_seq_len: int):
        # Week 3 Day 2: PagedBatchingKvCache: keep max_active_requests and max_seq_len;
        # every slot None
        self.max_active_requests = max_active_requests
        self.max_seq_len = max_seq_len
        self.slots: list[PagedKvCache | None] = [None] * max_active_requests

    @property
    def offset(self) -> list[int]:
        # Week 3 Day 2: offset: each slot's view's offset, 0 for an empty slot
        return [0 if view is None else view.offset for view in self.slots]

    @property
    def rows(self) -> int:
        """The highest slot in use + 1 (0 when empty): the rows a step must feed."""
        # Week 3 Day 2: rows: the highest occupied slot + 1, 0 when empty
        return max((i + 1 for i, view in enumerate(self.slots) if view), default=0)

    def add_request(self, prefilled: PagedKvCache, slot: int) -> None:
        """Row `slot` reads and writes through the request's own block table."""
        # Week 3 Day 2: add_request: ValueError for a slot outside [0,
        # max_active_requests) or in use; else the slot holds the request's PagedKvCache
        # (nothing is copied)
        if not 0 <= slot < self.max_active_requests:
            raise ValueError(f"slot {slot} is outside [0, {self.max_active_requests})")
        if self.slots[slot] is not None:
            raise ValueError(f"slot {slot} is in use: remove_request it first")
        self.slots[slot] = prefilled

    def remove_request(self, slot: int) -> None:
        """Row `slot` is empty again; the request's blocks are the engine's to release."""
        # Week 3 Day 2: remove_request: the slot holds None
        self.slots[slot] = None

    def row_view(self, slot: int, offset: int) -> PagedKvCache:
        """Row `slot` as one sequence's cache from position `offset` on (week 3 day
        4's draft tokens): a second view of the request's blocks, so the row's own
        count is left as it is until set_offset."""
        # Week 3 Day 4: row_view: a PagedKvCache over the slot's layer and table, at
        # offset
        view = self.slots[slot]
        return PagedKvCache(view.layer, view.table, offset)

    def set_offset(self, slot: int, offset: int) -> None:
        """Row `slot` holds exactly `offset` positions from now on."""
        # Week 3 Day 4: set_offset: the slot's view's offset = offset
        self.slots[slot].offset = offset

    def stage(self, keys: mx.array, values: mx.array) -> None:
        """keys/values: [B, H, L, D]: each occupied row's L tokens staged through its
        own view at its offset (an empty row's are dropped); the offsets before the
        step are kept for the mask."""
        # Week 3 Day 2: stage: check rows <= B <= max_active_requests and S =
        # max(offsets) + L <= max_seq_len as BatchingKvCache does, and that some row is
        # occupied and has room (check_room) before staging any; keep the offsets
        # before the step; stage keys[b:b+1] through each occupied row's view
        B, _, L, _ = keys.shape
        if not self.rows <= B <= self.max_active_requests:
            raise ValueError(
                f"a step must feed between {self.rows} rows (the slots in use) and "
                f"{self.max_active_requests}, got {B}"
            )
        self.step_offsets = self.offset[:B]
        if max(self.step_offsets) + L > self.max_seq_len:
            raise ValueError(f"a request would pass max_seq_len={self.max_seq_len}")
        views = self.slots[:B]
        used = [b for b, view in enumerate(views) if view is not None]
        if not used:
            raise ValueError("a paged decode step needs a request in some slot")
        for b in used:  # every row checked before any is staged
            views[b].check_room(views[b].offset + L)
        for b in used:
            views[b].stage(keys[b : b + 1], values[b : b + 1])
        self.staged_length = L

    def fetch_staged(self) -> tuple[mx.array, mx.array, mx.array]:
        """keys/values [B, H, S, D], S = the longest row's offset before the step +
        L, every row read through its table (an empty row: an empty table), and the
        mask [B, 1, L, S] from the offsets before the step."""
        # Week 3 Day 2: fetch_staged: gather every row's table to S positions through
        # the layer of an occupied view; batch_causal_mask from the kept offsets
        L, offsets = self.staged_length, self.step_offsets
        views = self.slots[: len(offsets)]
        S = max(offsets) + L
        layer = next(view.layer for view in views if view is not None)
        tables = [[] if view is None else view.table.blocks for view in views]
        keys, values = layer.gather(tables, S)
        return keys, values, batch_causal_mask(mx.array(offsets), L, S, keys.dtype)

    def attend_staged(self, q: mx.array, attention) -> mx.array:
        """q: [B, H_q, L, D] (rotated) -> [B, H_q, L, D], as attention over
        fetch_staged() gives it, but each group of rows of similar length
        (group_rows) is gathered to its own longest row and attended in its own
        attention(q, keys, values, mask) call: a short row no longer pays for the
        longest one. A group whose rows all hold the same length needs only the
        chunk mask ("causal", or None for L = 1)."""
        # Week 3 Day 2: attend_staged: the lengths after the step (kept offsets + L);
        # for each group of group_rows(lengths): gather its tables to its longest
        # length through the layer of an occupied view, batch_causal_mask from its kept
        # offsets (or the chunk mask when its lengths are equal), attention on its rows
        # of q; the groups' outputs back in row order
        L, offsets = self.staged_length, self.step_offsets
        views = self.slots[: len(offsets)]
        layer = next(view.layer for view in views if view is not None)
        tables = [[] if view is None else view.table.blocks for view in views]
        lengths = [offset + L for offset in offsets]
        groups = group_rows(lengths, CALL_POSITIONS)
        outs = []
        for rows in groups:
            S = max(lengths[b] for b in rows)
            keys, values = layer.gather([tables[b] for b in rows], S)
            if all(lengths[b] == S for b in rows):
                mask = "causal" if L > 1 else None
            else:
                row_offsets = mx.array([offsets[b] for b in rows])
                mask = batch_causal_mask(row_offsets, L, S, keys.dtype)
            part = q if len(rows) == len(offsets) else q[mx.array(rows)]
            outs.append(attention(part, keys, values, mask))
        if len(groups) == 1:
            return outs[0]
        order = [b for rows in groups for b in rows]
        where = sorted(range(len(order)), key=order.__getitem__)  # row b's place
        return mx.concatenate(outs)[mx.array(where)]

    def update_and_fetch(
        self, keys: mx.array, values: mx.array
    ) -> tuple[mx.array, mx.array, mx.array]:
        """keys/values: [B, H, L, D], row b written at its request's offset (an empty
        row's are dropped). Returns keys/values [B, H, S, D], S = the longest row's
        offset + L, and the mask [B, 1, L, S] from each row's offset."""
        self.stage(keys, values)
        return self.fetch_staged()
