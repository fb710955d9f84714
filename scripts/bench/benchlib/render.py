"""What a benchmark shows on the terminal and in its Markdown report: rich tables.
Nothing here measures; the pictures are in plots.py."""

import math
from collections.abc import Callable, Iterable

from rich.table import Table

from .goals import Goal
from .measure import Run


def kind(run: Run) -> str:
    return run.config.split()[0]


def seconds(value: float, digits: int = 2) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.{digits}f}"


def row(run: Run, reference: Run) -> list[str]:
    same = sum(a == b for a, b in zip(run.tokens, reference.tokens))
    return [
        run.config,
        f"{run.total_s:.1f}",
        f"{run.generation_tps:.1f}",
        f"{seconds(run.ttft_p50_s)} / {seconds(run.ttft_p99_s)}",
        " ".join(seconds(t) for t in run.ttft_long_s),
        f"{run.itl_p50_ms:.0f} / {run.itl_p99_ms:.0f}",
        f"{run.longest_stall_s:.2f}",
        f"{run.peak_memory_mb:.0f}",
        f"{same}/{len(run.tokens)}",
        str(run.unfinished),
    ]


COLUMNS = (
    "config",
    "total s",
    "gen tok/s",
    "TTFT p50 / p99 s",
    "TTFT long s",
    "ITL p50 / p99 ms",
    "longest stall s",
    "peak MB",
    "same tokens",
    "unfinished",
)


def table(title: str, runs: list[Run]) -> Table:
    """One row per configuration; "same tokens" counts requests whose tokens equal
    the first configuration's."""
    result = Table(title=title)
    for column in COLUMNS:
        result.add_column(column, justify="left" if column == "config" else "right")
    for i, run in enumerate(runs):
        next_kind = kind(runs[i + 1]) if i + 1 < len(runs) else None
        result.add_row(*row(run, runs[0]), end_section=next_kind != kind(run))
    return result


def grid(
    title: str, columns: list[str] | dict[str, Callable], rows: Iterable | dict
) -> Table:
    """A plain table: the first column left-aligned, the others right. columns: the
    headers, each row a list of cells; or {header: cell function}, each row what
    the functions read (rows a dict: each key and value, cell(key, value)). None
    between rows: a section line."""
    result = Table(title=title)
    for i, column in enumerate(columns):
        result.add_column(column, justify="right" if i else "left")
    pairs = isinstance(rows, dict)
    cells = columns.values() if isinstance(columns, dict) else None
    for row in rows.items() if pairs else rows:
        if row is None:
            result.add_section()
        elif cells is None:
            result.add_row(*row)
        else:
            result.add_row(*(cell(*row) if pairs else cell(row) for cell in cells))
    return result


def markdown(title: str, runs: list[Run], goals: list[Goal]) -> str:
    """The same table in Markdown, then the goals' lines, for the book."""
    lines = [f"**{title}**", "", "| " + " | ".join(COLUMNS) + " |"]
    lines.append("|" + "---|" * len(COLUMNS))
    lines += ["| " + " | ".join(row(run, runs[0])) + " |" for run in runs]
    lines.append("")
    lines += [f"- {goal.line()}" for goal in goals]
    return "\n".join(lines) + "\n"
