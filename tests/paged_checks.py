"""What the paged-cache tests (week 3 days 2 and 3) share: running an engine to the
end while checking its block pool after every step, and the pool's bookkeeping rules.

The rules are read off the engine's state as the chapters name it: `pool` (the
BlockPool: refcounts, free, cached, hash_of, block_of), `tables` (request ->
BlockTable) and `slots`.
"""

from collections import Counter

from . import helpers


def check_pool(engine) -> None:
    """Every block is exactly one of: held (refcount = the tables that list it),
    free, or cached (hashed, held by nobody); names map both ways."""
    pool = engine.kv.pool
    holders = Counter(b for table in engine.kv.tables.values() for b in table.blocks)
    assert len(pool.refcounts) == pool.high_water <= pool.num_blocks
    assert all(b < pool.high_water for b in holders), "a held block was never given"
    for block in range(pool.high_water):
        assert pool.refcounts[block] == holders[block], (
            f"block {block}: refcount {pool.refcounts[block]}, held by "
            f"{holders[block]} tables"
        )
    free, cached = list(pool.free), list(pool.cached)
    assert len(set(free)) == len(free), "a block is free twice"
    assert not set(free) & set(cached), "a block is both free and cached"
    assert not (set(free) | set(cached)) & set(holders), "a held block is free"
    assert len(free) + len(cached) + len(holders) == pool.high_water, "a block leaked"
    assert set(cached) <= set(pool.hash_of), "a cached block has no name"
    assert all(pool.block_of[h] == b for b, h in pool.hash_of.items())
    assert len(pool.block_of) == len(pool.hash_of)
    for request, table in engine.kv.tables.items():
        assert not request.is_finished, "a finished request still holds blocks"
        assert request.offset <= len(table.blocks) * engine.config.block_size
        assert len(table.blocks) == len(set(table.blocks)), "a table repeats a block"


def assert_pool_empty(engine) -> None:
    """After a run: nothing held, every block free or cached, and the cached blocks
    are exactly the named ones."""
    check_pool(engine)
    pool = engine.kv.pool
    assert engine.kv.tables == {}
    assert pool.in_use == 0 and all(n == 0 for n in pool.refcounts)
    assert set(pool.cached) == set(pool.hash_of)
    assert len(pool.free) + len(pool.cached) == pool.high_water


def run_engine(engine, specs, check=check_pool, max_steps: int = 3000) -> list:
    """helpers.run_engine with check() after every step: the pool's rules by
    default."""
    return helpers.run_engine(engine, specs, check, max_steps)
