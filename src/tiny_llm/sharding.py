"""Who holds what under tensor parallelism: heads and MLP columns split over ranks.

Nothing here touches an array. A rank asks which attention heads and which slice of
the MLP are its own; tensor_parallel.py then cuts the weights to match. Counts that
do not divide by the number of ranks are split as evenly as possible, the larger
pieces to the lower ranks: split_evenly(9, 2) == [5, 4].
"""

from dataclasses import dataclass


def split_evenly(total: int, parts: int) -> list[int]:
    """The sizes of `parts` contiguous pieces of `total`, as equal as possible, the
    larger ones first. split_evenly(3, 2) == [2, 1]; the sizes add up to total."""
    raise NotImplementedError(
        "Week 4 Day 1 Task 1: split_evenly: each piece gets total // parts, and the "
        "first total % parts pieces one more; ValueError for parts < 1 or total < 0"
    )


def shard_range(total: int, size: int, rank: int, unit: int = 1) -> tuple[int, int]:
    """[start, stop) of rank `rank`'s contiguous piece when `total` items are split
    over `size` ranks in whole units of `unit` items (a quantized matrix's columns
    come in groups): split_evenly on total // unit, times unit. ValueError unless
    unit divides total (rank and unit are trusted: rank in 0 .. size - 1, unit at
    least 1)."""
    raise NotImplementedError(
        "Week 4 Day 1 Task 1: shard_range: ValueError unless unit divides total; the "
        "pieces of split_evenly, counted in units"
    )


@dataclass(frozen=True)
class HeadShard:
    """One rank's attention heads: query heads q_start .. q_stop - 1 and the KV heads
    kv_start .. kv_stop - 1 those query heads read. With grouped-query attention
    query head i reads KV head i // (num_heads // num_kv_heads)."""

    q_start: int
    q_stop: int
    kv_start: int
    kv_stop: int

    @property
    def num_heads(self) -> int:
        return self.q_stop - self.q_start

    @property
    def num_kv_heads(self) -> int:
        return self.kv_stop - self.kv_start


def shard_heads(num_heads: int, num_kv_heads: int, size: int) -> list[HeadShard]:
    """Each of `size` ranks' heads, rank 0 first.

    At least as many KV heads as ranks: each rank takes whole groups (a KV head and
    all the query heads that read it), split_evenly over the KV heads; 9 query and 3
    KV heads on 2 ranks give rank 0 six query heads and two KV heads, rank 1 three
    and one. Fewer KV heads than ranks: each KV head is copied to several ranks
    (split_evenly of the ranks over the KV heads), which split its query heads in
    order, split_evenly of the group over them (3 query heads and 1 KV head on 2
    ranks: heads 0-1, then head 2). A rank then holds one KV head, so its grouped
    attention still lines up. Every rank needs at least one query head: more ranks
    than query heads is a ValueError that says "run at most {num_heads} ranks"
    (num_kv_heads is trusted to be at least 1).
    """
    raise NotImplementedError(
        "Week 4 Day 1 Task 1: shard_heads: ValueError when size < 1 or size > "
        'num_heads ("run at most {num_heads} ranks"), or num_kv_heads does not divide'
        " num_heads; then the two cases of the docstring, each with split_evenly"
    )
