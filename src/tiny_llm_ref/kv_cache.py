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
        # Week 2 Day 1 Task 1: TinyKvCache is the interface; TinyKvFullCache (and on Day
        # 5 BatchingKvCache) implement update_and_fetch
        raise NotImplementedError

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
        # Week 2 Day 1 Task 1: TinyKvFullCache: start empty: no key/value storage yet
        # and offset 0
        self.keys: mx.array | None = None
        self.values: mx.array | None = None
        self.offset = 0

    def update_and_fetch(
        self, keys: mx.array, values: mx.array
    ) -> tuple[mx.array, mx.array, mx.array | str | None]:
        # Week 2 Day 1 Task 1: update_and_fetch: grow the storage if offset + L does not
        # fit, write keys/values at offset .. offset + L - 1, advance offset, and return
        # keys[:, :, :offset], values[:, :, :offset] and the mask ("causal" when L > 1,
        # None for one token)
        B, H, L, D = keys.shape
        end = self.offset + L
        if self.keys is None or end > self.keys.shape[2]:
            self.grow(
                B,
                H,
                max(end, 2 * self.capacity(), self.INITIAL_CAPACITY),
                D,
                keys.dtype,
            )
        self.keys[:, :, self.offset : end, :] = keys
        self.values[:, :, self.offset : end, :] = values
        self.offset = end
        mask = "causal" if L > 1 else None
        return self.keys[:, :, :end, :], self.values[:, :, :end, :], mask

    def capacity(self) -> int:
        # Week 2 Day 1 Task 1: capacity: how many tokens the storage holds (0 when
        # empty)
        return 0 if self.keys is None else self.keys.shape[2]

    def grow(self, B: int, H: int, capacity: int, D: int, dtype: mx.Dtype) -> None:
        # Week 2 Day 1 Task 1: grow: allocate [B, H, capacity, D] keys and values and
        # copy the first offset tokens over (update_and_fetch asks for at least twice
        # the old capacity, and INITIAL_CAPACITY the first time)
        keys = mx.zeros((B, H, capacity, D), dtype)
        values = mx.zeros((B, H, capacity, D), dtype)
        if self.keys is not None:
            keys[:, :, : self.offset, :] = self.keys[:, :, : self.offset, :]
            values[:, :, : self.offset, :] = self.values[:, :, : self.offset, :]
        self.keys, self.values = keys, values

    def fetch(self) -> tuple[mx.array, mx.array]:
        """All stored keys and values: [B, H, offset, D]."""
        # Week 2 Day 1 Task 1: fetch: the stored keys and values up to offset
        return self.keys[:, :, : self.offset, :], self.values[:, :, : self.offset, :]


def batch_causal_mask(offsets: mx.array, L: int, S: int, dtype: mx.Dtype) -> mx.array:
    """The chunk mask with one offset per row: [B, 1, L, S].

    Row b's query i sees key j iff j <= offsets[b] + i. An empty row (offset 0) still
    sees key 0, so no row is all -inf and softmax never makes NaN.
    """
    # Week 2 Day 5 Task 1: batch_causal_mask: compare arange(S) with offsets[b] +
    # arange(L) per row; 0 where visible, -inf elsewhere; add the head axis
    visible = (
        mx.arange(S)[None, None, :]
        <= offsets[:, None, None] + mx.arange(L)[None, :, None]
    )
    return mx.where(visible, mx.array(0, dtype), mx.array(-mx.inf, dtype))[
        :, None, :, :
    ]


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
        # Week 2 Day 5 Task 2: BatchingKvCache: keep the sizes, no storage yet (it grows
        # when the head count and dtype are known, see fit) and one offset 0 per slot
        self.max_active_requests = max_active_requests
        self.max_seq_len = max_seq_len
        self.keys: mx.array | None = None
        self.values: mx.array | None = None
        self.offsets = [0] * max_active_requests

    @property
    def offset(self) -> list[int]:
        # Week 2 Day 5 Task 2: BatchingKvCache.offset: a copy of the per-slot offsets
        return list(self.offsets)

    @property
    def rows(self) -> int:
        """The highest slot in use + 1 (0 when empty): the rows a step must feed."""
        # Week 2 Day 5 Task 2: rows: 1 + the highest slot whose offset is not 0; 0 when
        # every slot is empty
        return max((slot + 1 for slot, n in enumerate(self.offsets) if n), default=0)

    def fit(self, rows: int, length: int, H: int, D: int, dtype: mx.Dtype) -> None:
        """Make the storage exactly `rows` rows of at least `length` positions.

        Rows cut from the end must be empty; the other rows keep their keys and values.
        """
        # Week 2 Day 5 Task 2: fit: cut the storage to `rows` rows if it has more; if it
        # then has fewer rows or fewer than `length` positions, allocate zeroed [rows,
        # H, capacity, D] keys and values (capacity: at least length, twice the old and
        # INITIAL_CAPACITY, at most max_seq_len) and copy the old storage in
        stored_rows, stored_length = (
            (0, 0) if self.keys is None else (self.keys.shape[0], self.keys.shape[2])
        )
        if stored_rows > rows:
            self.keys, self.values = self.keys[:rows], self.values[:rows]
            stored_rows = rows
        if stored_rows == rows and length <= stored_length:
            return
        capacity = stored_length
        if length > capacity:
            capacity = max(length, 2 * capacity, self.INITIAL_CAPACITY)
            capacity = min(capacity, self.max_seq_len)
        keys = mx.zeros((rows, H, capacity, D), dtype)
        values = mx.zeros((rows, H, capacity, D), dtype)
        if self.keys is not None:
            keys[:stored_rows, :, :stored_length, :] = self.keys
            values[:stored_rows, :, :stored_length, :] = self.values
        self.keys, self.values = keys, values

    def add_request(self, prefilled: TinyKvFullCache, slot: int) -> None:
        """Copy a prefilled request's keys/values [1, H, S, D] into row `slot`."""
        # Week 2 Day 5 Task 2: add_request: ValueError for a slot outside [0,
        # max_active_requests), a slot in use, or S > max_seq_len; fit the storage to
        # cover row slot and S positions; copy the prefilled keys/values into row slot;
        # offset S
        if not 0 <= slot < self.max_active_requests:
            raise ValueError(f"slot {slot} is outside [0, {self.max_active_requests})")
        if self.offsets[slot]:
            raise ValueError(f"slot {slot} is in use: remove_request it first")
        keys, values = prefilled.fetch()
        _, H, S, D = keys.shape
        if S > self.max_seq_len:
            raise ValueError(
                f"a request of {S} tokens does not fit max_seq_len={self.max_seq_len}"
            )
        stored = 0 if self.keys is None else self.keys.shape[0]
        self.fit(max(stored, slot + 1), S, H, D, keys.dtype)
        self.keys[slot, :, :S, :] = keys[0]
        self.values[slot, :, :S, :] = values[0]
        self.offsets[slot] = S

    def remove_request(self, slot: int) -> None:
        """Free row `slot`: its offset goes back to 0, so its old keys are never seen.

        An empty cache lets go of its storage.
        """
        # Week 2 Day 5 Task 2: remove_request: set the slot's offset back to 0; drop the
        # storage once no slot is in use
        self.offsets[slot] = 0
        if self.rows == 0:
            self.keys = self.values = None

    def row_view(self, slot: int, offset: int) -> "BatchRowView":
        """Row `slot` as one sequence's cache that writes from position `offset` on
        (week 3 day 4: a decoding request's draft tokens, fed as their own part of a
        mixed step after its decode row). The row's count is left as it is: the
        engine keeps what it accepts with set_offset."""
        # Week 3 Day 4 Task 3: row_view: a BatchRowView of this cache, slot and offset
        return BatchRowView(self, slot, offset)

    def set_offset(self, slot: int, offset: int) -> None:
        """Row `slot` holds exactly `offset` positions from now on: keys written past
        them (rejected draft tokens) are never seen."""
        # Week 3 Day 4 Task 3: set_offset: offsets[slot] = offset
        self.offsets[slot] = offset

    def update_and_fetch(
        self, keys: mx.array, values: mx.array
    ) -> tuple[mx.array, mx.array, mx.array | str | None]:
        """keys/values: [B, H, L, D], rows <= B <= max_active_requests; row b is
        written at offsets[b]. Returns keys/values [B, H, S, D] and the mask.

        When every row fed is at the same offset (always so for one row), the step
        is a single sequence's: one slice write, and the mask TinyKvFullCache gives
        ("causal", or None for one token), so no per-row arrays are built."""
        # Week 2 Day 5 Task 2: update_and_fetch: ValueError unless rows <= B <=
        # max_active_requests, or when a row would pass max_seq_len; fit the storage to
        # B rows and S = max(offsets[:B]) + L positions; rows all at one offset: write
        # them as one slice, mask "causal" (None for L = 1); else write row b's L
        # keys/values at offsets[b] and build batch_causal_mask; advance the non-empty
        # rows, return [:, :, :S] and the mask
        B, H, L, D = keys.shape
        if not self.rows <= B <= self.max_active_requests:
            raise ValueError(
                f"a step must feed between {self.rows} rows (the slots in use) and "
                f"{self.max_active_requests}, got {B}"
            )
        offsets = self.offsets[:B]
        S = max(offsets) + L
        if S > self.max_seq_len:
            raise ValueError(f"a request would pass max_seq_len={self.max_seq_len}")
        self.fit(B, S, H, D, keys.dtype)
        if min(offsets) == S - L:  # one offset: the rows are one sequence's shape
            self.keys[:, :, S - L : S, :] = keys
            self.values[:, :, S - L : S, :] = values
            mask = "causal" if L > 1 else None
        else:
            row_offsets = mx.array(offsets)
            positions = (row_offsets[:, None] + mx.arange(L)[None, :])[:, None, :, None]
            self.keys = mx.put_along_axis(self.keys, positions, keys, axis=2)
            self.values = mx.put_along_axis(self.values, positions, values, axis=2)
            mask = batch_causal_mask(row_offsets, L, S, keys.dtype)
        # An empty slot (offset 0) stays empty: its row is computed but never kept.
        self.offsets[:B] = [offset + L if offset else 0 for offset in offsets]
        return self.keys[:, :, :S, :], self.values[:, :, :S, :], mask


class BatchRowView(TinyKvCache):
    """One row of a BatchingKvCache, seen as a single sequence's cache from `offset`
    on: keys/values [1, H, L, D] go to row `slot` at offset .. offset + L - 1, and
    the row's keys up to there come back, with the chunk mask. It reads the batch
    cache's storage when it writes, not when it is made: the decode part of the same
    step may have replaced that storage in between. That decode part has written
    the row first, so batch.keys is never None here."""

    def __init__(self, batch: BatchingKvCache, slot: int, offset: int) -> None:
        # Week 3 Day 4 Task 3: BatchRowView: keep the batch cache, the slot and the
        # offset
        self.batch = batch
        self.slot = slot
        self.offset = offset

    def update_and_fetch(
        self, keys: mx.array, values: mx.array
    ) -> tuple[mx.array, mx.array, str | None]:
        # Week 3 Day 4 Task 3: update_and_fetch: ValueError past max_seq_len; fit the
        # batch storage to the rows it already has (batch.keys.shape[0], not 1: the
        # other slots' keys must stay) and offset + L positions; write row slot's
        # positions offset .. offset + L - 1; advance offset; return the row's keys and
        # values [1, H, offset, D] and the mask ("causal" when L > 1, None for one
        # token)
        _, H, L, D = keys.shape
        batch, end = self.batch, self.offset + L
        if end > batch.max_seq_len:
            raise ValueError(f"a request would pass max_seq_len={batch.max_seq_len}")
        batch.fit(batch.keys.shape[0], end, H, D, keys.dtype)
        batch.keys[self.slot, :, self.offset : end, :] = keys[0]
        batch.values[self.slot, :, self.offset : end, :] = values[0]
        self.offset = end
        row = slice(self.slot, self.slot + 1)
        mask = "causal" if L > 1 else None
        return batch.keys[row, :, :end, :], batch.values[row, :, :end, :], mask
