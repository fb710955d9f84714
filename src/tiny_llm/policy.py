"""Policies: what each step runs, decided with the planner's mechanism (planner.py).

A policy is an object over the planner with one method, `plans()`, which yields the
step's plans one at a time: the engine runs each before the policy makes the next,
so a plan sees what the forward before it did. Two policies:
- AlternatePolicy (week 2 days 6 and 7): ONE chunk of the most urgent waiting
  request, then every decoding request's next token: two forwards a step.
- MixedPolicy (week 3 day 1, mixed_policy.py): every decode row and prefill chunks
  within a token budget: ONE forward a step.

Both take room through their Preemption (preemption.py). The engine's make_policy
chooses one by config.policy.
"""

from abc import ABC, abstractmethod
from collections.abc import Iterator

from .planner import Plan, Planner
from .preemption import Preemption


class Policy(ABC):
    """planner: the Planner. config: its EngineConfig. preemption: a Preemption
    over the planner, whose count is `preemptions`."""

    def __init__(self, planner: Planner):
        self.planner = planner
        self.config = planner.config
        self.preemption = Preemption(planner)

    @property
    def preemptions(self) -> int:
        """Requests preempted so far."""
        return self.preemption.count

    @abstractmethod
    def plans(self) -> Iterator[Plan]:
        """The step's plans, in order; the engine runs each before asking for the
        next. Prefilled requests take their slots (place_prefilled) in here."""


class AlternatePolicy(Policy):
    """Week 2 days 6 and 7: a chunk's forward, then the decodes' forward."""

    def plans(self) -> Iterator[Plan]:
        """plan_chunk(); the requests it prefilled take their slots
        (place_prefilled); then plan_decodes(), so a request whose prompt just ended
        decodes in the same step. Both are yielded even when empty (Plan() is
        falsy): Engine.run skips an empty plan."""
        raise NotImplementedError(
            "Week 2 Day 6 Task 3: plans: yield plan_chunk(), place_prefilled, yield "
            "plan_decodes()"
        )

    def plan_chunk(self) -> Plan:
        """The chunk: the most urgent waiting request that is still prefilling, will
        have a slot when done and gets room from the KV manager
        (planner.prefill_candidates), with planner.chunk_size(request) tokens (None:
        the rest of its prompt), as many as preemption.reserve_chunk makes room for
        (none: no chunk this step). A policy's bad chunk size (chunk_size raises
        TypeError or ValueError) fails that request alone, request.fail(f"prefill
        failed: {type(error).__name__}: {error}"); it is retired at once
        (planner.retire_finished) and no chunk runs this step (an empty Plan)."""
        raise NotImplementedError(
            "Week 2 Day 6 Task 3: plan_chunk: the first of "
            "planner.prefill_candidates(); its size, cut to what reserve_chunk makes "
            "room for; Plan(chunks=[(request, size)]), or an empty Plan when that is "
            "0"
        )

    def plan_decodes(self) -> Plan:
        """The decode forward: room for every decoding request's next token
        (preemption.make_room_for_decodes), then the rows up to the highest slot in
        use."""
        raise NotImplementedError(
            "Week 2 Day 6 Task 3: plan_decodes: make_room_for_decodes(), then "
            "Plan(rows=planner.decode_rows())"
        )
