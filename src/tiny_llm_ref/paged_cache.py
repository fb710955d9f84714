"""Week 3 day 2: the paged KV cache's views: requests' caches that read and write
through their block tables into each layer's LayerBlocks (layer_blocks.py; the ids
and tables are block_pool.py's).

A dense cache gives every decode slot max_seq_len positions up front. Here a
PagedKvCache is one request's view of one layer (the model calls it like
TinyKvFullCache); a PagedBatchingKvCache holds the decode rows' views (the engine
calls it like BatchingKvCache). Attention reads a request's keys by gathering its
blocks in table order; a step's writes are staged in the layer and written in one
scatter before the first read.
"""

import mlx.core as mx

from .block_pool import BlockTable
from .kv_cache import TinyKvCache, batch_causal_mask
from .layer_blocks import LayerBlocks


class PagedKvCache(TinyKvCache):
    """One request's cache in one layer: its BlockTable into the layer's LayerBlocks.

    offset: tokens this layer holds for the request (it may start above 0 when a
    cached prefix was shared). The table must already hold the blocks a step writes
    to: the engine reserves them before the forward.
    """

    def __init__(self, layer: LayerBlocks, table: BlockTable, offset: int = 0):
        # Week 3 Day 2 Task 2: PagedKvCache: keep the layer's LayerBlocks, the request's
        # BlockTable and offset
        self.layer = layer
        self.table = table
        self.offset = offset

    @property
    def keys(self) -> mx.array | None:
        # Week 3 Day 2 Task 2: keys: the layer's pool of keys (layer.keys)
        return self.layer.keys

    @property
    def values(self) -> mx.array | None:
        # Week 3 Day 2 Task 2: values: the layer's pool of values (layer.values)
        return self.layer.values

    def check_room(self, end: int) -> None:
        # Week 3 Day 2 Task 2: check_room: ValueError unless positions 0 .. end - 1 fit
        # the table's blocks (len(blocks) * block_size), saying to reserve blocks before
        # the forward
        capacity = len(self.table.blocks) * self.layer.block_size
        if end > capacity:
            raise ValueError(
                f"position {end - 1} is past the request's {len(self.table.blocks)} "
                "blocks: reserve its blocks before the forward"
            )

    def stage(self, keys: mx.array, values: mx.array) -> None:
        """keys/values: [1, H, L, D] at positions offset .. offset + L - 1, staged in
        the layer (written at the next read); offset += L."""
        # Week 3 Day 2 Task 2: stage: check_room(offset + L); stage rows [L, H, D] in
        # the layer at each position's block and slot; remember L; offset += L
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
        # Week 3 Day 2 Task 2: fetch_staged: gather the table's first offset positions;
        # mask 'causal' when the staged L > 1 else None
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

    Rows are taken longest first (equal lengths in row order); a row joins the
    group before it when that group's longest is at most call_positions positions
    longer, else it starts a group. So a row never pays for more than
    call_positions positions it does not hold, and rows of about one length share
    one call.
    """
    # Week 3 Day 2 Task 3: group_rows: sort the row indexes by length, longest first; a
    # row whose length is within call_positions of its group's first (longest) row joins
    # it, else it starts a new group; each group's indexes sorted
    groups: list[list[int]] = []
    for b in sorted(range(len(lengths)), key=lambda b: -lengths[b]):
        if groups and lengths[groups[-1][0]] - lengths[b] <= call_positions:
            groups[-1].append(b)
        else:
            groups.append([b])
    return [sorted(rows) for rows in groups]


def take_rows(x: mx.array, rows: list[int]) -> mx.array:
    """x's rows `rows` (sorted): a slice, no copy, when they are a run."""
    if rows == list(range(rows[0], rows[-1] + 1)):
        return x[rows[0] : rows[-1] + 1]
    return x[mx.array(rows)]


class PagedBatchingKvCache(TinyKvCache):
    """One layer's decode rows, like BatchingKvCache, but a slot holds a request's
    PagedKvCache instead of a copy of its keys: moving a prefilled request into a
    slot copies nothing.

    slots: max_active_requests entries, the PagedKvCache in row i or None. The
    layer's LayerBlocks is reached through a slot's view (view.layer), so a step
    with no occupied row has nothing to write to: stage raises ValueError ("a paged
    decode step needs a request in some slot").
    """

    def __init__(self, max_active_requests: int, max_seq_len: int):
        # Week 3 Day 2 Task 3: PagedBatchingKvCache: keep max_active_requests and
        # max_seq_len; every slot None
        self.max_active_requests = max_active_requests
        self.max_seq_len = max_seq_len
        self.slots: list[PagedKvCache | None] = [None] * max_active_requests

    @property
    def offset(self) -> list[int]:
        # Week 3 Day 2 Task 3: offset: each slot's view's offset, 0 for an empty slot
        return [0 if view is None else view.offset for view in self.slots]

    @property
    def rows(self) -> int:
        """The highest slot in use + 1 (0 when empty): the rows a step must feed."""
        # Week 3 Day 2 Task 3: rows: the highest occupied slot + 1, 0 when empty
        return max((i + 1 for i, view in enumerate(self.slots) if view), default=0)

    def add_request(self, prefilled: PagedKvCache, slot: int) -> None:
        """Row `slot` reads and writes through the request's own block table."""
        # Week 3 Day 2 Task 3: add_request: ValueError for a slot outside [0,
        # max_active_requests) or in use; else the slot holds the request's PagedKvCache
        # (nothing is copied)
        if not 0 <= slot < self.max_active_requests:
            raise ValueError(f"slot {slot} is outside [0, {self.max_active_requests})")
        if self.slots[slot] is not None:
            raise ValueError(f"slot {slot} is in use: remove_request it first")
        self.slots[slot] = prefilled

    def remove_request(self, slot: int) -> None:
        """Row `slot` is empty again; the request's blocks are the engine's to release."""
        # Week 3 Day 2 Task 3: remove_request: the slot holds None
        self.slots[slot] = None

    def row_view(self, slot: int, offset: int) -> PagedKvCache:
        """Row `slot` as one sequence's cache from position `offset` on (week 3 day
        4's draft tokens): a second view of the request's blocks, so the row's own
        count is left as it is until set_offset."""
        # Week 3 Day 4 Task 3: row_view: a PagedKvCache over the slot's layer and table,
        # at offset
        view = self.slots[slot]
        return PagedKvCache(view.layer, view.table, offset)

    def set_offset(self, slot: int, offset: int) -> None:
        """Row `slot` holds exactly `offset` positions from now on."""
        # Week 3 Day 4 Task 3: set_offset: the slot's view's offset = offset
        self.slots[slot].offset = offset

    def stage(self, keys: mx.array, values: mx.array) -> None:
        """keys/values: [B, H, L, D]: each occupied row's L tokens staged through its
        own view at its offset (an empty row's are dropped); the offsets before the
        step are kept for the mask."""
        # Week 3 Day 2 Task 3: stage: check rows <= B <= max_active_requests and S =
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
        # Week 3 Day 2 Task 3: fetch_staged: gather every row's table to S positions
        # through the layer of an occupied view; batch_causal_mask from the kept offsets
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
        # Week 3 Day 2 Task 3: attend_staged: the lengths after the step (kept offsets +
        # L); for each group of group_rows(lengths), taken in order of their first rows:
        # gather its tables to its longest length through the layer of an occupied view,
        # batch_causal_mask from its kept offsets (or the chunk mask when its lengths
        # are equal), attention on its rows of q (take_rows); the groups' outputs
        # concatenated, put back in row order only when they are not already
        L, offsets = self.staged_length, self.step_offsets
        views = self.slots[: len(offsets)]
        layer = next(view.layer for view in views if view is not None)
        tables = [[] if view is None else view.table.blocks for view in views]
        lengths = [offset + L for offset in offsets]
        groups = sorted(group_rows(lengths, CALL_POSITIONS))  # by first row
        outs = []
        for rows in groups:
            S = max(lengths[b] for b in rows)
            keys, values = layer.gather([tables[b] for b in rows], S)
            if all(lengths[b] == S for b in rows):
                mask = "causal" if L > 1 else None
            else:
                row_offsets = mx.array([offsets[b] for b in rows])
                mask = batch_causal_mask(row_offsets, L, S, keys.dtype)
            outs.append(attention(take_rows(q, rows), keys, values, mask))
        out = outs[0] if len(groups) == 1 else mx.concatenate(outs)
        order = [b for rows in groups for b in rows]
        if order == sorted(order):
            return out
        where = sorted(range(len(order)), key=order.__getitem__)  # row b's place
        return out[mx.array(where)]

    def update_and_fetch(
        self, keys: mx.array, values: mx.array
    ) -> tuple[mx.array, mx.array, mx.array]:
        """keys/values: [B, H, L, D], row b written at its request's offset (an empty
        row's are dropped). Returns keys/values [B, H, S, D], S = the longest row's
        offset + L, and the mask [B, 1, L, S] from each row's offset."""
        self.stage(keys, values)
        return self.fetch_staged()
