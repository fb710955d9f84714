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
        raise NotImplementedError(
            "Week 3 Day 2 Task 2: PagedKvCache: keep the layer's LayerBlocks, the "
            "request's BlockTable and offset"
        )

    @property
    def keys(self) -> mx.array | None:
        raise NotImplementedError(
            "Week 3 Day 2 Task 2: keys: the layer's pool of keys (layer.keys)"
        )

    @property
    def values(self) -> mx.array | None:
        raise NotImplementedError(
            "Week 3 Day 2 Task 2: values: the layer's pool of values (layer.values)"
        )

    def check_room(self, end: int) -> None:
        raise NotImplementedError(
            "Week 3 Day 2 Task 2: check_room: ValueError unless positions 0 .. end - "
            "1 fit the table's blocks (len(blocks) * block_size), saying to reserve "
            "blocks before the forward"
        )

    def stage(self, keys: mx.array, values: mx.array) -> None:
        """keys/values: [1, H, L, D] at positions offset .. offset + L - 1, staged in
        the layer (written at the next read); offset += L."""
        raise NotImplementedError(
            "Week 3 Day 2 Task 2: stage: check_room(offset + L); stage rows [L, H, D]"
            " in the layer at each position's block and slot; remember L; offset += L"
        )

    def fetch_staged(self) -> tuple[mx.array, mx.array, str | None]:
        """All keys/values [1, H, offset, D] and the mask of the staged step
        ("causal", or None for L = 1)."""
        raise NotImplementedError(
            "Week 3 Day 2 Task 2: fetch_staged: gather the table's first offset "
            "positions; mask 'causal' when the staged L > 1 else None"
        )

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
    raise NotImplementedError(
        "Week 3 Day 2 Task 3: group_rows: sort the row indexes by length, longest "
        "first; a row whose length is within call_positions of its group's first "
        "(longest) row joins it, else it starts a new group; each group's indexes "
        "sorted"
    )


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
        raise NotImplementedError(
            "Week 3 Day 2 Task 3: PagedBatchingKvCache: keep max_active_requests and "
            "max_seq_len; every slot None"
        )

    @property
    def offset(self) -> list[int]:
        raise NotImplementedError(
            "Week 3 Day 2 Task 3: offset: each slot's view's offset, 0 for an empty "
            "slot"
        )

    @property
    def rows(self) -> int:
        """The highest slot in use + 1 (0 when empty): the rows a step must feed."""
        raise NotImplementedError(
            "Week 3 Day 2 Task 3: rows: the highest occupied slot + 1, 0 when empty"
        )

    def add_request(self, prefilled: PagedKvCache, slot: int) -> None:
        """Row `slot` reads and writes through the request's own block table."""
        raise NotImplementedError(
            "Week 3 Day 2 Task 3: add_request: ValueError for a slot outside [0, "
            "max_active_requests) or in use; else the slot holds the request's "
            "PagedKvCache (nothing is copied)"
        )

    def remove_request(self, slot: int) -> None:
        """Row `slot` is empty again; the request's blocks are the engine's to release."""
        raise NotImplementedError(
            "Week 3 Day 2 Task 3: remove_request: the slot holds None"
        )

    def row_view(self, slot: int, offset: int) -> PagedKvCache:
        """Row `slot` as one sequence's cache from position `offset` on (week 3 day
        4's draft tokens): a second view of the request's blocks, so the row's own
        count is left as it is until set_offset."""
        raise NotImplementedError(
            "Week 3 Day 4 Task 3: row_view: a PagedKvCache over the slot's layer and "
            "table, at offset"
        )

    def set_offset(self, slot: int, offset: int) -> None:
        """Row `slot` holds exactly `offset` positions from now on."""
        raise NotImplementedError(
            "Week 3 Day 4 Task 3: set_offset: the slot's view's offset = offset"
        )

    def stage(self, keys: mx.array, values: mx.array) -> None:
        """keys/values: [B, H, L, D]: each occupied row's L tokens staged through its
        own view at its offset (an empty row's are dropped); the offsets before the
        step are kept for the mask."""
        raise NotImplementedError(
            "Week 3 Day 2 Task 3: stage: check rows <= B <= max_active_requests and S"
            " = max(offsets) + L <= max_seq_len as BatchingKvCache does, and that "
            "some row is occupied and has room (check_room) before staging any; keep "
            "the offsets before the step; stage keys[b:b+1] through each occupied "
            "row's view"
        )

    def fetch_staged(self) -> tuple[mx.array, mx.array, mx.array]:
        """keys/values [B, H, S, D], S = the longest row's offset before the step +
        L, every row read through its table (an empty row: an empty table), and the
        mask [B, 1, L, S] from the offsets before the step."""
        raise NotImplementedError(
            "Week 3 Day 2 Task 3: fetch_staged: gather every row's table to S "
            "positions through the layer of an occupied view; batch_causal_mask from "
            "the kept offsets"
        )

    def attend_staged(self, q: mx.array, attention) -> mx.array:
        """q: [B, H_q, L, D] (rotated) -> [B, H_q, L, D], as attention over
        fetch_staged() gives it, but each group of rows of similar length
        (group_rows) is gathered to its own longest row and attended in its own
        attention(q, keys, values, mask) call: a short row no longer pays for the
        longest one. A group whose rows all hold the same length needs only the
        chunk mask ("causal", or None for L = 1)."""
        raise NotImplementedError(
            "Week 3 Day 2 Task 3: attend_staged: the lengths after the step (kept "
            "offsets + L); for each group of group_rows(lengths), taken in order of "
            "their first rows: gather its tables to its longest length through the "
            "layer of an occupied view, batch_causal_mask from its kept offsets (or "
            "the chunk mask when its lengths are equal), attention on its rows of q "
            "(take_rows); the groups' outputs concatenated, put back in row order "
            "only when they are not already"
        )

    def update_and_fetch(
        self, keys: mx.array, values: mx.array
    ) -> tuple[mx.array, mx.array, mx.array]:
        """keys/values: [B, H, L, D], row b written at its request's offset (an empty
        row's are dropped). Returns keys/values [B, H, S, D], S = the longest row's
        offset + L, and the mask [B, 1, L, S] from each row's offset."""
        self.stage(keys, values)
        return self.fetch_staged()
