"""The pictures a benchmark draws, each from its results (PNG, matplotlib's Agg
backend, imported only when a picture is drawn). Nothing here measures."""

import math
from pathlib import Path

from .measure import MARGIN, Run
from .render import kind

POLICY_STYLE = {  # marker and color per kind of configuration
    "alternate": ("o", "tab:blue"),
    "mixed": ("^", "tab:green"),
    "mlx-lm": ("s", "tab:red"),
}


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_pareto(cases: dict[str, list[Run]], path: Path) -> None:
    """Longest stall against total time, one panel per case. The shaded corner
    below and left of each mlx-lm point is where a configuration of ours must land
    to beat it by 10% on both."""
    plt = pyplot()
    figure, axes = plt.subplots(
        1, len(cases), figsize=(6.2 * len(cases), 5), squeeze=False
    )
    for ax, (title, runs) in zip(axes[0], cases.items()):
        for run in runs:
            marker, color = POLICY_STYLE[kind(run)]
            ax.scatter(run.total_s, run.longest_stall_s, marker=marker, color=color)
            ax.annotate(
                run.config.split(" ", 1)[1],
                (run.total_s, run.longest_stall_s),
                textcoords="offset points",
                xytext=(4, 3),
                fontsize=7,
                color=color,
            )
            if run.engine == "mlx-lm":
                x, y = run.total_s * (1 - MARGIN), run.longest_stall_s * (1 - MARGIN)
                ax.fill_between([0, x], 0, y, color=color, alpha=0.05)
                ax.plot([0, x, x], [y, y, 0], color=color, alpha=0.25, lw=0.8)
        for label, (marker, color) in POLICY_STYLE.items():
            ax.scatter([], [], marker=marker, color=color, label=label)
        ax.set_xlabel("total time (s)")
        ax.set_ylabel("longest stall (s)")
        ax.set_yscale("log")
        ax.set_xlim(0, max(r.total_s for r in runs) * 1.15)
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8, loc="upper left")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


METRICS = (
    ("ttft_p99_s", "TTFT p99 (s)"),
    ("itl_p99_ms", "ITL p99 (ms)"),
    ("generation_tps", "generation (tok/s)"),
    ("peak_memory_mb", "peak memory (MB)"),
)


def plot_metrics(cases: dict[str, list[Run]], path: Path) -> None:
    """A bar per configuration for each metric, one row of panels per case."""
    plt = pyplot()
    height = 0.25 * max(map(len, cases.values())) + 1.2
    figure, axes = plt.subplots(
        len(cases),
        len(METRICS),
        figsize=(3.4 * len(METRICS) + 1.5, height * len(cases)),
        squeeze=False,
    )
    for ax_row, (title, runs) in zip(axes, cases.items()):
        labels = [r.config for r in runs]
        colors = [POLICY_STYLE[kind(r)][1] for r in runs]
        for col, (ax, (attribute, label)) in enumerate(zip(ax_row, METRICS)):
            ax.barh(
                range(len(runs)), [getattr(r, attribute) for r in runs], color=colors
            )
            ax.set_yticks(range(len(runs)), labels if col == 0 else [""] * len(runs))
            ax.invert_yaxis()
            ax.tick_params(labelsize=7)
            ax.set_xlabel(label, fontsize=8)
            ax.grid(alpha=0.3, axis="x")
        ax_row[0].set_title(title, fontsize=9, loc="left")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def timeline_window(run: Run, short: list[bool]) -> tuple[float, float]:
    """Around the first long prompt: from 1 s before it arrives to 1.5 s after its
    first token; the whole run when every request is short."""
    for request, is_short in zip(run.requests, short):
        if not is_short and request["first_token_s"] is not None:
            return request["arrival_s"] - 1.0, request["first_token_s"] + 1.5
    return 0.0, run.total_s


def plot_timeline(panels: list[tuple[str, Run]], short: list[bool], path: Path) -> None:
    """One panel per run, one lane per request: a bar for each prefill chunk
    (labelled with its tokens) and each decode token, from the ForwardRecords."""
    plt = pyplot()
    lanes = len(short)
    figure, axes = plt.subplots(
        len(panels), 1, figsize=(13, (0.45 * lanes + 1.2) * len(panels)), squeeze=False
    )
    for ax, (title, run) in zip(axes[:, 0], panels):
        low, high = timeline_window(run, short)
        for forward in run.forwards:
            if forward["end"] < low or forward["start"] > high:
                continue
            width = forward["end"] - forward["start"]
            for request, tokens in forward["chunks"]:
                ax.barh(
                    request,
                    width,
                    left=forward["start"],
                    height=0.7,
                    color="tab:orange",
                    edgecolor="white",
                    linewidth=0.4,
                )
                if width > (high - low) / 40:
                    ax.text(
                        forward["start"] + width / 2,
                        request,
                        str(tokens),
                        ha="center",
                        va="center",
                        fontsize=6,
                    )
            for request in forward["decodes"]:
                ax.barh(
                    request,
                    width,
                    left=forward["start"],
                    height=0.4,
                    color="tab:blue",
                    edgecolor="white",
                    linewidth=0.3,
                )
        for i, request in enumerate(run.requests):
            if request["arrival_s"] is not None and low <= request["arrival_s"] <= high:
                ax.plot(request["arrival_s"], i, marker=">", color="black", ms=5)
        ax.set_xlim(low, high)
        ax.set_ylim(lanes - 0.5, -0.5)
        ax.set_yticks(
            range(lanes),
            [
                f"#{i} ({r['prompt_tokens']} tok{'' if s else ', long'})"
                for i, (r, s) in enumerate(zip(run.requests, short))
            ],
            fontsize=7,
        )
        ax.set_title(
            f"{title}: longest stall {run.longest_stall_s:.2f} s, "
            f"total {run.total_s:.1f} s",
            fontsize=9,
            loc="left",
        )
        ax.grid(alpha=0.3, axis="x")
    axes[-1, 0].set_xlabel(
        "seconds since the run started (orange: a prefill chunk, its tokens; blue: "
        "a decode token; triangle: arrival)"
    )
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def plot_accepted_lengths(
    panels: dict[str, Run], most: int, path: Path, window: int = 8
) -> None:
    """One panel per run: each verification's accepted length (1 + drafts kept) at
    its engine step, a dot; the mean of the last `window` verifications, a line;
    `most` (1 + k) dashed. Steps with no dot verified nothing."""
    plt = pyplot()
    columns = 2
    rows = math.ceil(len(panels) / columns)
    figure, axes = plt.subplots(
        rows, columns, figsize=(12, 3.2 * rows), squeeze=False, sharey=True
    )
    for ax, (title, run) in zip(axes.flat, panels.items()):
        steps, lengths = [], []
        for step, forward in enumerate(run.forwards):
            for _, _, accepted in forward.get("drafts", []):
                steps.append(step)
                lengths.append(1 + accepted)
        recent = [
            sum(lengths[max(0, i + 1 - window) : i + 1]) / min(i + 1, window)
            for i in range(len(lengths))
        ]
        ax.scatter(steps, lengths, s=8, alpha=0.3, color="tab:blue")
        ax.plot(steps, recent, color="tab:orange", lw=1, label=f"last {window}")
        ax.axhline(most, color="0.5", ls="--", lw=0.8, label=f"most: {most}")
        mean = sum(lengths) / len(lengths) if lengths else 0.0
        ax.set_title(
            f"{title}: mean {mean:.2f} over {len(lengths)} verifications in "
            f"{len(run.forwards)} steps",
            fontsize=9,
            loc="left",
        )
        ax.set_xlim(0, max(len(run.forwards), 1))
        ax.set_ylim(0.5, most + 0.5)
        ax.set_xlabel("engine step", fontsize=8)
        ax.set_ylabel("accepted length", fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def plot_prefix_cache(cases: dict[str, list], path: Path) -> None:
    """bench-prefix-cache: TTFT p50 and p99 bars per runner (log scale), its hit
    rate above them; one panel per workload."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, (name, results) in zip(axes, cases.items()):
        labels = [r.runner.replace(", ", "\n") for r in results]
        p50 = [r.percentile(50) for r in results]
        p99 = [r.percentile(99) for r in results]
        x = range(len(results))
        ax.bar([i - 0.2 for i in x], p50, 0.4, label="TTFT p50")
        ax.bar([i + 0.2 for i in x], p99, 0.4, label="TTFT p99")
        ax.set_xticks(list(x), labels, fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("seconds (log)")
        ax.set_title(name, fontsize=10)
        for i, r in enumerate(results):
            ax.annotate(
                f"hit {100 * r.hit_rate:.0f}%",
                (i, max(p50[i], p99[i])),
                ha="center",
                va="bottom",
                fontsize=8,
            )
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_paged(step: dict, soak: dict, budget: dict, chats: dict, path: Path) -> None:
    """bench-paged's four parts: the mixed step's time per runner, the soak's peak
    memory, requests decoding per step in one KV budget, TTFT by chat turn."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 4, figsize=(16, 3.8))
    names = list(step["seconds"])
    axes[0].bar(range(len(names)), [1000 * step["seconds"][n] for n in names])
    axes[0].set_xticks(
        range(len(names)), [n.replace(", ", "\n") for n in names], fontsize=8
    )
    axes[0].set_ylabel("ms")
    axes[0].set_title("one mixed step (4 decodes + 32 tokens)", fontsize=10)
    peaks = soak["peak_bytes"]
    axes[1].bar(range(len(peaks)), [v / 2**20 for v in peaks.values()])
    axes[1].set_xticks(range(len(peaks)), list(peaks))
    axes[1].set_ylabel("MiB")
    axes[1].set_title("soak: peak MLX memory above the start", fontsize=10)
    for name, run in budget["runs"].items():
        axes[2].plot(run["decoding"], label=f"{name} (batch_size {run['batch_size']})")
    axes[2].set_xlabel("step")
    axes[2].set_ylabel("requests decoding")
    axes[2].set_title(
        f"same KV budget: {budget['budget_tokens']:,} tokens", fontsize=10
    )
    axes[2].legend(fontsize=8)
    for name, run in chats["turns"].items():
        axes[3].plot(
            range(1, len(run["ttft"]) + 1),
            [1000 * t for t in run["ttft"]],
            marker="o",
            label=name,
        )
    axes[3].set_xlabel("turn")
    axes[3].set_ylabel("TTFT (ms)")
    axes[3].set_title("10-turn chat, resent whole each turn", fontsize=10)
    axes[3].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_request_lanes(panels: dict[str, list[dict]], path: Path) -> None:
    """bench-latency: one panel per title, one line per request in arrival order
    (each {arrival, prefill_start, tokens: times, short}): grey while it waits,
    orange while its prompt is prefilled (first chunk -> first token), blue while
    it decodes; a long request's line is thick."""
    plt = pyplot()
    figure, axes = plt.subplots(
        len(panels), 1, figsize=(13, 2.4 * len(panels)), sharex=True, squeeze=False
    )
    for ax, (title, requests) in zip(axes[:, 0], panels.items()):
        done = [r for r in requests if r["tokens"]]
        for lane, r in enumerate(sorted(done, key=lambda r: r["arrival"])):
            first, last = r["tokens"][0], r["tokens"][-1]
            started = r["prefill_start"] or first
            for x0, x1, color in (
                (r["arrival"], started, "0.75"),
                (started, first, "tab:orange"),
                (first, last, "tab:blue"),
            ):
                width = 1.0 if r["short"] else 4.0
                ax.plot(
                    [x0, x1], [lane] * 2, color=color, lw=width, solid_capstyle="butt"
                )
        ax.set_title(title, fontsize=9, loc="left")
        ax.set_ylim(len(done), -1)
        ax.set_ylabel("request", fontsize=8)
        ax.grid(alpha=0.3, axis="x")
    axes[-1, 0].set_xlabel(
        "seconds since the trace started (grey: waiting; orange: prefilling; blue: "
        "decoding; thick: the long prompt)"
    )
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
