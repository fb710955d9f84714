"""The numbers a load run yields, and how they are shown: a rich table, JSON, plots.

TTFT: request sent -> first content chunk. ITL: the gaps between one request's
consecutive content chunks. Requests/s and tokens/s: completed requests and their
completion tokens over the run's wall-clock time. Errors: requests that got no
complete answer (an HTTP error, an error event, a dropped connection, the time
limit); a client's own cancellation is no error.
"""

import json
from pathlib import Path

import numpy as np
from rich.table import Table

from .client import Outcome


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def summarize(name: str, outcomes: list[Outcome], wall_s: float) -> dict:
    completed = [o for o in outcomes if o.error is None and not o.cancelled]
    ttft = [o.ttft_s for o in outcomes if o.ttft_s is not None and o.error is None]
    short_ttft = [
        o.ttft_s
        for o in outcomes
        if o.ttft_s is not None and o.error is None and o.kind == "short"
    ]
    itl = [gap for o in outcomes if o.error is None for gap in o.itl_s]
    tokens = sum(o.tokens for o in completed)
    errors = [o for o in outcomes if o.error is not None]
    return {
        "server": name,
        "requests": len(outcomes),
        "completed": len(completed),
        "cancelled": sum(o.cancelled for o in outcomes),
        "errors": len(errors),
        "server_errors": sum(o.status is not None and o.status >= 500 for o in errors),
        "error_examples": sorted({o.error for o in errors})[:5],
        "wall_s": wall_s,
        "ttft_p50_s": percentile(ttft, 50),
        "ttft_p99_s": percentile(ttft, 99),
        "ttft_short_p50_s": percentile(short_ttft, 50),
        "ttft_short_p99_s": percentile(short_ttft, 99),
        "itl_p50_ms": 1000 * percentile(itl, 50),
        "itl_p99_ms": 1000 * percentile(itl, 99),
        "requests_per_s": len(completed) / wall_s if wall_s else 0.0,
        "tokens_per_s": tokens / wall_s if wall_s else 0.0,
        "completion_tokens": tokens,
        "prompt_tokens": sum(o.prompt_tokens for o in completed),
    }


def table(title: str, summaries: list[dict]) -> Table:
    result = Table(title=title)
    for column in (
        "server",
        "done/sent",
        "errors",
        "TTFT p50 / p99 s",
        "short TTFT p50 / p99 s",
        "ITL p50 / p99 ms",
        "req/s",
        "tok/s",
        "wall s",
    ):
        result.add_column(column, justify="left" if column == "server" else "right")
    for s in summaries:
        result.add_row(
            s["server"],
            f"{s['completed']}/{s['requests']}",
            str(s["errors"]),
            f"{s['ttft_p50_s']:.2f} / {s['ttft_p99_s']:.2f}",
            f"{s['ttft_short_p50_s']:.2f} / {s['ttft_short_p99_s']:.2f}",
            f"{s['itl_p50_ms']:.0f} / {s['itl_p99_ms']:.0f}",
            f"{s['requests_per_s']:.2f}",
            f"{s['tokens_per_s']:.1f}",
            f"{s['wall_s']:.1f}",
        )
    return result


def write_json(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2, default=float) + "\n")


def plot(path: Path, runs: dict[str, list[Outcome]], title: str) -> None:
    """Two panels: the TTFT and ITL distributions (CDFs) of each server."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for name, outcomes in runs.items():
        ttft = sorted(
            o.ttft_s for o in outcomes if o.ttft_s is not None and not o.error
        )
        itl = sorted(1000 * g for o in outcomes if not o.error for g in o.itl_s)
        for axis, values in ((left, ttft), (right, itl)):
            if values:
                fraction = np.arange(1, len(values) + 1) / len(values)
                axis.step(values, fraction, where="post", label=name)
    left.set(xlabel="time to first token (s)", ylabel="fraction of requests")
    right.set(xlabel="inter-token latency (ms)", ylabel="fraction of gaps")
    for axis in (left, right):
        axis.set_xscale("log")
        axis.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        axis.grid(alpha=0.3)
        axis.legend()
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
