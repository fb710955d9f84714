"""KV caches: keep every layer's past keys and values so each step computes only new ones.

Shapes: keys and values are `[B, H, L, D]` going in (this step's L tokens) and
`[B, H, S, D]` coming out (everything the queries may attend to). `update_and_fetch`
also returns the mask for this step, so every path applies the one chunk-mask rule:
query i of a step that starts at position `offset` sees key j iff `j <= offset + i`.
"""

import mlx.core as mx


class TinyKvCache:
    """One layer's cache. `offset` counts the tokens stored so far: an int when all
    rows hold the same number (TinyKvFullCache), a list with one count per row when
    they differ (BatchingKvCache). The model's offset must equal it (check_offset).
    """

    offset: int | list[int]

    def update_and_fetch(
        self, keys: mx.array, values: mx.array
    ) -> tuple[mx.array, mx.array, mx.array | str | None]:
        """Store this step's keys/values [B, H, L, D]; return all keys, values and the mask."""
        raise NotImplementedError(
            "Week 2 Day 1 Task 1: TinyKvCache is the interface; TinyKvFullCache (and "
            "on Day 5 BatchingKvCache) implement update_and_fetch"
        )

    def stage(self, keys: mx.array, values: mx.array) -> None:
        """The first half of update_and_fetch, for a step of several parts (week 3
        day 1's mixed step stages every part before any part reads): hold this
        step's keys/values. A cache whose parts share one array (week 3 day 2's
        paged pool) writes them all at the first fetch, in one scatter."""
        self.staged = (keys, values)

    def fetch_staged(self) -> tuple[mx.array, mx.array, mx.array | str | None]:
        """The second half: what update_and_fetch returns for the staged keys and
        values."""
        keys, values = self.staged
        self.staged = None
        return self.update_and_fetch(keys, values)

    def attend_staged(self, q: mx.array, attention) -> mx.array:
        """q: [B, H_q, L, D] (rotated) -> [B, H_q, L, D]: attention(q, keys, values,
        mask) over what fetch_staged returns. A cache whose rows hold different
        lengths may read them its own way (week 3 day 2's paged decode rows attend
        in groups of similar length)."""
        return attention(q, *self.fetch_staged())


class TinyKvFullCache(TinyKvCache):
    """A growing cache for one sequence (or B sequences of equal length).

    Storage is preallocated and doubles when full, so a step copies only its own
    L new tokens (amortized), never all past keys: decoding stays linear, not quadratic.
    """

    INITIAL_CAPACITY = 256

    def __init__(self) -> None:
        raise NotImplementedError(
            "Week 2 Day 1 Task 1: TinyKvFullCache: start empty: no key/value storage "
            "yet and offset 0"
        )

    def update_and_fetch(
        self, keys: mx.array, values: mx.array
    ) -> tuple[mx.array, mx.array, mx.array | str | None]:
        raise NotImplementedError(
            "Week 2 Day 1 Task 1: update_and_fetch: grow the storage if offset + L "
            "does not fit, write keys/values at offset .. offset + L - 1, advance "
            "offset, and return keys[:, :, :offset], values[:, :, :offset] and the "
            'mask ("causal" when L > 1, None for one token)'
        )

    def capacity(self) -> int:
        raise NotImplementedError(
            "Week 2 Day 1 Task 1: capacity: how many tokens the storage holds (0 when"
            " empty)"
        )

    def grow(self, B: int, H: int, capacity: int, D: int, dtype: mx.Dtype) -> None:
        raise NotImplementedError(
            "Week 2 Day 1 Task 1: grow: allocate [B, H, capacity, D] keys and values "
            "and copy the first offset tokens over (update_and_fetch asks for at "
            "least twice the old capacity, and INITIAL_CAPACITY the first time)"
        )

    def fetch(self) -> tuple[mx.array, mx.array]:
        """All stored keys and values: [B, H, offset, D]."""
        raise NotImplementedError(
            "Week 2 Day 1 Task 1: fetch: the stored keys and values up to offset"
        )


def batch_causal_mask(offsets: mx.array, L: int, S: int, dtype: mx.Dtype) -> mx.array:
    """The chunk mask with one offset per row: [B, 1, L, S].

    Row b's query i sees key j iff j <= offsets[b] + i. An empty row (offset 0) still
    sees key 0, so no row is all -inf and softmax never makes NaN.
    """
    raise NotImplementedError(
        "Week 2 Day 5 Task 1: batch_causal_mask: compare arange(S) with offsets[b] + "
        "arange(L) per row; 0 where visible, -inf elsewhere; add the head axis"
    )


class BatchingKvCache(TinyKvCache):
    """One layer's cache for up to `max_active_requests` sequences of different lengths.

    Each request owns a slot, a batch row: row b holds its keys at positions
    0 .. offsets[b] - 1, and its mask comes from its own offset, so rows never see
    each other's keys, nor what a removed request left behind. Storage
    [rows, H, capacity, D] grows as it is used: `rows` up to the highest slot in use
    + 1, capacity doubling up to max_seq_len, so a large batch or a long max_seq_len
    costs nothing until requests need it. Fill the lowest free slot first and feed a
    step `rows` rows.
    """

    INITIAL_CAPACITY = 256

    def __init__(self, max_active_requests: int, max_seq_len: int) -> None:
        raise NotImplementedError(
            "Week 2 Day 5 Task 2: BatchingKvCache: keep the sizes, no storage yet (it"
            " grows when the head count and dtype are known, see fit) and one offset "
            "0 per slot"
        )

    @property
    def offset(self) -> list[int]:
        raise NotImplementedError(
            "Week 2 Day 5 Task 2: BatchingKvCache.offset: a copy of the per-slot "
            "offsets"
        )

    @property
    def rows(self) -> int:
        """The highest slot in use + 1 (0 when empty): the rows a step must feed."""
        raise NotImplementedError(
            "Week 2 Day 5 Task 2: rows: 1 + the highest slot whose offset is not 0; 0"
            " when every slot is empty"
        )

    def fit(self, rows: int, length: int, H: int, D: int, dtype: mx.Dtype) -> None:
        """Make the storage exactly `rows` rows of at least `length` positions.

        Rows cut from the end must be empty; the other rows keep their keys and values.
        """
        raise NotImplementedError(
            "Week 2 Day 5 Task 2: fit: cut the storage to `rows` rows if it has more;"
            " if it then has fewer rows or fewer than `length` positions, allocate "
            "zeroed [rows, H, capacity, D] keys and values (capacity: at least "
            "length, twice the old and INITIAL_CAPACITY, at most max_seq_len) and "
            "copy the old storage in"
        )

    def add_request(self, prefilled: TinyKvFullCache, slot: int) -> None:
        """Copy a prefilled request's keys/values [1, H, S, D] into row `slot`."""
        raise NotImplementedError(
            "Week 2 Day 5 Task 2: add_request: ValueError for a slot outside [0, "
            "max_active_requests), a slot in use, or S > max_seq_len; fit the storage"
            " to cover row slot and S positions; copy the prefilled keys/values into "
            "row slot; offset S"
        )

    def remove_request(self, slot: int) -> None:
        """Free row `slot`: its offset goes back to 0, so its old keys are never seen.

        An empty cache lets go of its storage.
        """
        raise NotImplementedError(
            "Week 2 Day 5 Task 2: remove_request: set the slot's offset back to 0; "
            "drop the storage once no slot is in use"
        )

    def row_view(self, slot: int, offset: int) -> "BatchRowView":
        """Row `slot` as one sequence's cache that writes from position `offset` on
        (week 3 day 4: a decoding request's draft tokens, fed as their own part of a
        mixed step after its decode row). The row's count is left as it is: the
        engine keeps what it accepts with set_offset."""
        raise NotImplementedError(
            "Week 3 Day 4 Task 3: row_view: a BatchRowView of this cache, slot and "
            "offset"
        )

    def set_offset(self, slot: int, offset: int) -> None:
        """Row `slot` holds exactly `offset` positions from now on: keys written past
        them (rejected draft tokens) are never seen."""
        raise NotImplementedError(
            "Week 3 Day 4 Task 3: set_offset: offsets[slot] = offset"
        )

    def update_and_fetch(
        self, keys: mx.array, values: mx.array
    ) -> tuple[mx.array, mx.array, mx.array | str | None]:
        """keys/values: [B, H, L, D], rows <= B <= max_active_requests; row b is
        written at offsets[b]. Returns keys/values [B, H, S, D] and the mask.

        When every row fed is at the same offset (always so for one row), the step
        is a single sequence's: one slice write, and the mask TinyKvFullCache gives
        ("causal", or None for one token), so no per-row arrays are built."""
        raise NotImplementedError(
            "Week 2 Day 5 Task 2: update_and_fetch: ValueError unless rows <= B <= "
            "max_active_requests, or when a row would pass max_seq_len; fit the "
            "storage to B rows and S = max(offsets[:B]) + L positions; rows all at "
            'one offset: write them as one slice, mask "causal" (None for L = 1); '
            "else write row b's L keys/values at offsets[b] and build "
            "batch_causal_mask; advance the non-empty rows, return [:, :, :S] and the"
            " mask"
        )


class BatchRowView(TinyKvCache):
    """One row of a BatchingKvCache, seen as a single sequence's cache from `offset`
    on: keys/values [1, H, L, D] go to row `slot` at offset .. offset + L - 1, and
    the row's keys up to there come back, with the chunk mask. It reads the batch
    cache's storage when it writes, not when it is made: the decode part of the same
    step may have replaced that storage in between. That decode part has written
    the row first, so batch.keys is never None here."""

    def __init__(self, batch: BatchingKvCache, slot: int, offset: int) -> None:
        raise NotImplementedError(
            "Week 3 Day 4 Task 3: BatchRowView: keep the batch cache, the slot and "
            "the offset"
        )

    def update_and_fetch(
        self, keys: mx.array, values: mx.array
    ) -> tuple[mx.array, mx.array, str | None]:
        raise NotImplementedError(
            "Week 3 Day 4 Task 3: update_and_fetch: ValueError past max_seq_len; fit "
            "the batch storage to the rows it already has (batch.keys.shape[0], not "
            "1: the other slots' keys must stay) and offset + L positions; write row "
            "slot's positions offset .. offset + L - 1; advance offset; return the "
            'row\'s keys and values [1, H, offset, D] and the mask ("causal" when L > '
            "1, None for one token)"
        )
