"""A benchmark's goals: a named ratio with a bound, met or missed. A missed one says
what limited it; Bench.finish makes the exit status 1."""

import dataclasses
import math
from dataclasses import dataclass


@dataclass
class Goal:
    """`value` at most or at least `bound` (a ratio; None: never measured, missed).
    why: the figures behind the value; a missed goal says it as what limited it."""

    name: str
    value: float | None
    bound: float
    why: str
    at_most: bool = False

    @property
    def met(self) -> bool:
        if self.value is None or math.isnan(self.value):
            return False
        return self.value <= self.bound if self.at_most else self.value >= self.bound

    def line(self) -> str:
        digits = (
            4 if self.value is not None and round(self.value, 2) == self.bound else 2
        )
        value = "-" if self.value is None else f"{self.value:.{digits}f}"
        bound = f"{'at most' if self.at_most else 'at least'} {self.bound:g}"
        why = f"; {'' if self.met else 'limited by '}{self.why}" if self.why else ""
        return f"{'met' if self.met else 'MISSED'}: {self.name}: {value} ({bound}){why}"

    def record(self) -> dict:
        return {**dataclasses.asdict(self), "met": self.met}


def at_most(name: str, value: float | None, bound: float, why: str) -> Goal:
    return Goal(name, value, bound, why, at_most=True)


def at_least(name: str, value: float | None, bound: float, why: str) -> Goal:
    return Goal(name, value, bound, why)


def identical(name: str, same: int, of: int) -> Goal:
    """Every one of `of` outputs the same: the share that is, at least 1."""
    why = f"{same} of {of} the same" if of else "nothing compared"
    return Goal(name, same / of if of else None, 1.0, why)


def same_tokens(name: str, outputs: list, reference: list) -> Goal:
    """Every output equal to the reference's at its place (identical's counts)."""
    return identical(
        name, sum(a == b for a, b in zip(outputs, reference)), len(reference)
    )
