"""The requests a load test sends: chat questions, short and long, arriving as a
Poisson process (exponential gaps at a given rate), some of them cancelled by their
client after a few chunks."""

from dataclasses import dataclass

import numpy as np
from scripts.bench.benchlib.prompt_texts import NOTE_TOPICS, SHORT_QUESTIONS


@dataclass
class LoadRequest:
    """One client: when it arrives (seconds after the start), what it asks, how many
    tokens it wants, and after how many content chunks it hangs up (None: never)."""

    index: int
    arrival_s: float
    kind: str  # "short" or "long"
    question: str
    max_tokens: int
    cancel_after: int | None = None


def long_question(notes: int, rng: np.random.Generator) -> str:
    """About 27 tokens per note: numbered notes, then a question about them."""
    lines = [
        f"Note {n + 1}: on day {rng.integers(1, 29)} {NOTE_TOPICS[rng.integers(len(NOTE_TOPICS))]}"
        f" changed by {rng.integers(2, 90)} percent, after {rng.integers(1, 12)} quiet "
        "weeks."
        for n in range(notes)
    ]
    return "Read my notes.\n" + "\n".join(lines) + "\nWhich note surprised you most?"


def make_workload(
    count: int,
    rate: float,
    max_tokens: int,
    long_fraction: float = 0.25,
    long_notes: int = 12,
    cancel_fraction: float = 0.0,
    seed: int = 0,
) -> list[LoadRequest]:
    """`count` requests at `rate` per second on average; a `long_fraction` of them
    long (`long_notes` notes), a `cancel_fraction` cancelled after 1 to 5 chunks.
    The same arguments give the same workload."""
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1 / rate, count)
    arrivals = np.cumsum(gaps) - gaps[0]  # the first request opens the run
    requests = []
    for index, arrival in enumerate(arrivals):
        long = rng.random() < long_fraction
        question = (
            long_question(long_notes, rng)
            if long
            else SHORT_QUESTIONS[rng.integers(len(SHORT_QUESTIONS))]
        )
        cancel = int(rng.integers(1, 6)) if rng.random() < cancel_fraction else None
        requests.append(
            LoadRequest(
                index,
                float(arrival),
                "long" if long else "short",
                question,
                max_tokens,
                cancel,
            )
        )
    return requests
