"""The KV manager: where a request's keys and values live, behind one small interface.

The planner asks it four things, and never looks at the caches itself:

    admit(request) -> int | None  may the request start holding memory? None: it
                             waits; else how many of its prompt tokens are already
                             in its cache (a prefix cache hit, week 3 day 3; 0
                             without), which the planner moves the request past
    reserve(request, n) -> int  room for the request's next n tokens, before the
                             forward that computes them: how many fit (0 for a
                             decode: the planner preempts somebody and asks again)
    place(request, slot)     the prefilled request's cache becomes decode row `slot`
    release(request)         the request is done (finished, aborted, preempted):
                             take its memory back

and, after every step, `after_step()`; `batch_cache` holds the decode rows (one
cache per layer) that the model runner feeds. The given step-ahead runner
(step_ahead.py) asks one more thing, has_room(request, position): may the request's
row write that position now, without reserving? KvManager below is that interface as
code: an abstract base whose abstract methods every manager writes, with the row
moves all of them share. A KV manager never moves a request: it reports, and the
planner and the model runner write the request's position.

DenseKvManager (week 2 day 6) is the first: each prefilling request has its own
TinyKvFullCache per layer, and a decode slot is a row of day 5's BatchingKvCache, so
it always has room. Week 3 day 2's PagedKvManager keeps the same interface over a
pool of blocks, and day 3's PrefixCachingKvManager adds shared prefixes.
"""

from abc import ABC, abstractmethod

from tiny_llm_base import EngineConfig
from tiny_llm_base.memory import check_fits, kv_bytes_per_position

from .kv_cache import BatchingKvCache
from .request import Request


class KvManager(ABC):
    """The KV manager's interface, and what every KV manager shares: `batch_cache`,
    one decode-row cache per layer, and moving a request in and out of a row."""

    batch_cache: list

    @abstractmethod
    def admit(self, request: Request) -> int | None:
        """Room for the request's prefill: None when it must wait; else the tokens of
        its prompt its caches already hold (they start after them)."""

    @abstractmethod
    def reserve(self, request: Request, tokens: int) -> int:
        """Room for the request's next `tokens` tokens from its offset: how many fit."""

    @abstractmethod
    def release(self, request: Request) -> None:
        """The request is done or preempted: take its memory back."""

    @abstractmethod
    def has_room(self, request: Request, position: int) -> bool:
        """The request's row can write `position` now, with the memory it holds."""

    @abstractmethod
    def after_step(self) -> None:
        """Called once after every step."""

    @abstractmethod
    def record(self, metrics) -> None:
        """Write the manager's figures into the run's metrics."""

    def close(self) -> None:  # noqa: B027  (not abstract: most keep nothing)
        """The engine is done: keep what should outlive it (the disk tier's blocks,
        disk_tier.py). Nothing, for a manager that keeps everything in memory."""

    def place(self, request: Request, slot: int) -> None:
        """The prefilled request's cache becomes row `slot` of every layer's batch
        cache (add_request); the request's own reference to it is dropped."""
        # Week 2 Day 6 Task 2: place: add_request(the request cache of the layer, slot)
        # on every layer of batch_cache, then request.kv_cache = None
        for layer_cache, request_cache in zip(self.batch_cache, request.kv_cache):
            layer_cache.add_request(request_cache, slot)
        request.kv_cache = None

    def remove(self, slot: int) -> None:
        """Row `slot` is empty again in every layer (remove_request)."""
        # Week 2 Day 6 Task 2: remove: remove_request(slot) on every layer of
        # batch_cache
        for layer_cache in self.batch_cache:
            layer_cache.remove_request(slot)

    def keep_accepted(self, request: Request, slot: int) -> None:
        """After a verification: row `slot` keeps exactly the request's offset
        positions in every layer, so rejected drafts leave no trace."""
        # Week 3 Day 4 Task 3: keep_accepted: set_offset(slot, request.offset) on every
        # layer
        for layer in self.batch_cache:
            layer.set_offset(slot, request.offset)


class DenseKvManager(KvManager):
    """Dense caches: a request's own cache while it prefills, then a batch-cache row.

    model: anything with create_kv_cache() (one cache per layer).
    batch_cache: one BatchingKvCache(batch_size, max_seq_len) per layer; count the
        layers as len(model.create_kv_cache()).
    """

    def __init__(self, model, config: EngineConfig):
        config.check_dense_memory(model)
        per_position = kv_bytes_per_position(model)
        if per_position is not None:  # every slot holds at least one position
            check_fits(
                config.batch_size * per_position,
                f"batch_size {config.batch_size:,} at one position per slot",
                "lower batch_size",
            )
        self.model = model
        layers = len(model.create_kv_cache())
        self.batch_cache = [
            BatchingKvCache(config.batch_size, config.max_seq_len)
            for _ in range(layers)
        ]

    def admit(self, request: Request) -> int:
        """Room for the request's prefill: its own caches (a new set after a
        restart). Always room, none of it cached: 0."""
        # Week 2 Day 6 Task 2: admit: new caches (model.create_kv_cache()) for a request
        # that has none; 0
        if request.kv_cache is None:
            request.kv_cache = self.model.create_kv_cache()
        return 0

    def reserve(self, request: Request, tokens: int) -> int:
        """Room for the request's next `tokens` tokens: dense caches grow as they
        are written, so all of them."""
        return tokens

    def release(self, request: Request) -> None:
        """Nothing to give back: a finished request's own cache went with it, and its
        row was emptied by remove()."""

    def has_room(self, request: Request, position: int) -> bool:
        """A dense row grows as it is written: always."""
        return True

    def after_step(self) -> None:
        """Nothing to do after a step."""

    def record(self, metrics) -> None:
        """No figures of its own to report."""
