"""The numbers a run yields, from the timestamps of every generated token, and the
goals they are held to.

Every engine is timed the same way: TTFT = arrival -> first token; inter-token
latency (ITL) = the gaps between one request's consecutive tokens; longest stall =
the largest such gap of any request; throughput = generated tokens / total run time;
peak memory = MLX's peak during the run above what was in use before it.
"""

from dataclasses import asdict, dataclass, field
from itertools import pairwise

import numpy as np

from .goals import Goal, at_most
from .workloads import Workload

MARGIN = 0.10  # "at least 10% better": a ratio of 0.90 or less


@dataclass
class Run:
    """One configuration of one engine on one workload."""

    config: str
    engine: str
    total_s: float
    prompt_tokens: int
    generated_tokens: int
    ttft_p50_s: float
    ttft_p99_s: float
    ttft_short_p50_s: float
    ttft_long_s: list[float]
    itl_p50_ms: float
    itl_p99_ms: float
    longest_stall_s: float
    peak_memory_mb: float
    unfinished: int
    load_average: tuple[float, float]  # 1-minute load before and after the run
    tokens: list[list[int]] = field(repr=False)
    requests: list[dict] = field(repr=False, default_factory=list)
    forwards: list[dict] = field(repr=False, default_factory=list)

    @property
    def generation_tps(self) -> float:
        return self.generated_tokens / self.total_s

    @property
    def prompt_tps(self) -> float:
        return self.prompt_tokens / self.total_s

    def record(self) -> dict:
        """The run for the JSON file: its numbers, without token ids or forwards."""
        numbers = {
            k: v for k, v in asdict(self).items() if k not in ("tokens", "forwards")
        }
        numbers["generation_tps"] = self.generation_tps
        numbers["prompt_tps"] = self.prompt_tps
        return numbers


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def summarize(
    config: str,
    engine: str,
    workload: Workload,
    start: float,
    end: float,
    arrivals: list[float | None],
    token_times: list[list[float]],
    tokens: list[list[int]],
    finished: list[bool],
    peak_bytes: int,
    load_average: tuple[float, float],
    forwards: list[dict] = (),
) -> Run:
    """A run's numbers from each request's arrival and token timestamps (seconds on
    one clock). finished: whether each request ended by itself (EOS or max_tokens),
    not cut by the time limit; a request with no token has no TTFT."""
    ttft = [t[0] - a if t else None for t, a in zip(token_times, arrivals)]

    def since_start(t: float | None) -> float | None:
        return None if t is None else t - start

    gaps = [b - a for times in token_times for a, b in pairwise(times)]
    started = [t for t in ttft if t is not None]
    short_ttft = [t for t, s in zip(ttft, workload.short) if s and t is not None]
    return Run(
        config=config,
        engine=engine,
        total_s=end - start,
        prompt_tokens=workload.prompt_tokens,
        generated_tokens=sum(len(t) for t in tokens),
        ttft_p50_s=percentile(started, 50),
        ttft_p99_s=percentile(started, 99),
        ttft_short_p50_s=percentile(short_ttft, 50),
        ttft_long_s=[t for t, s in zip(ttft, workload.short) if not s],
        itl_p50_ms=percentile(gaps, 50) * 1e3,
        itl_p99_ms=percentile(gaps, 99) * 1e3,
        longest_stall_s=max(gaps, default=0.0),
        peak_memory_mb=peak_bytes / 2**20,
        unfinished=len(finished) - sum(finished),
        load_average=load_average,
        tokens=tokens,
        requests=[
            {
                "prompt_tokens": len(prompt),
                "arrival_s": since_start(arrival),
                "first_token_s": since_start(times[0] if times else None),
                "last_token_s": since_start(times[-1] if times else None),
                "longest_gap_s": max((b - a for a, b in pairwise(times)), default=0.0),
                "tokens": len(times),
            }
            for prompt, arrival, times in zip(workload.prompts, arrivals, token_times)
        ],
        forwards=list(forwards),
    )


def median_run(runs: list[Run]) -> Run:
    return sorted(runs, key=lambda r: r.total_s)[len(runs) // 2]


def dominance_goals(case: str, runs: list[Run]) -> list[Goal]:
    """For each mlx-lm configuration: is some configuration of ours at least 10%
    better on both the longest stall and the total time? The best of ours is the
    one whose worse ratio is smallest, among our runs that finished (a cut run's
    times are lower bounds, which would flatter it); a miss names the ratio above
    0.90. A peer cut by the time limit is named: its times are lower bounds too, so
    a goal met against it holds, and a miss may be the cut's."""
    ours = [r for r in runs if r.engine == "ours" and not r.unfinished]
    goals = []
    for peer in (r for r in runs if r.engine == "mlx-lm"):
        ratios = [
            (r, r.longest_stall_s / peer.longest_stall_s, r.total_s / peer.total_s)
            for r in ours
        ]
        if not ratios:
            why = "no run of ours finished within the time limit (--time-limit)"
            goals.append(at_most(f"{case}: vs {peer.config}", None, 1 - MARGIN, why))
            continue
        best, stall, total = min(ratios, key=lambda x: max(x[1], x[2]))
        both = (("longest stall", stall), ("total time", total))
        over = [f"the {name}" for name, r in both if r > 1 - MARGIN]
        cut = f", cut with {peer.unfinished} unfinished" if peer.unfinished else ""
        name = (
            f"{case}: vs {peer.config} (stall {peer.longest_stall_s:.2f} s, total "
            f"{peer.total_s:.1f} s{cut}), best of ours {best.config}, its worse ratio"
        )
        why = f"{stall:.2f}x the stall, {total:.2f}x the total time"
        why = f"{' and '.join(over)} ({why})" if over else why
        goals.append(at_most(name, max(stall, total), 1 - MARGIN, why))
    return goals


def memory_goals(case: str, runs: list[Run]) -> list[Goal]:
    """Each unchunked configuration of ours against mlx-lm's unchunked peak memory."""
    peer = next((r for r in runs if r.config == "mlx-lm none"), None)
    if peer is None:
        return []
    return [
        at_most(
            f"{case}: unchunked peak memory, {r.config} / mlx-lm none",
            r.peak_memory_mb / peer.peak_memory_mb,
            1.0,
            f"{r.peak_memory_mb:.0f} MB vs {peer.peak_memory_mb:.0f} MB",
        )
        for r in runs
        if r.engine == "ours" and r.config in ("alternate none", "mixed none")
    ]


def decode_seconds(run: Run) -> float:
    """The time some request of the run was decoding: the union of the spans from
    each request's first token to its last (prefill before a first token is not
    decoding; a gap where nobody decodes does not count)."""
    spans = sorted(
        (r["first_token_s"], r["last_token_s"]) for r in run.requests if r["tokens"] > 1
    )
    total, reached = 0.0, float("-inf")
    for first, last in spans:
        total += max(0.0, last - max(first, reached))
        reached = max(reached, last)
    return total


def decode_tps(run: Run) -> float:
    """Decode tokens/s: the tokens after each request's first, over decode_seconds."""
    tokens = sum(max(0, r["tokens"] - 1) for r in run.requests)
    seconds = decode_seconds(run)
    return tokens / seconds if seconds else float("nan")
