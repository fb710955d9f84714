"""What batch-main shows of a run: the live table of the decode slots while it
runs, then every prompt's answer (shortened), the run's figures and the failures."""

import sys

from rich.console import Console, Group
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text


def one_line(text: str) -> str:
    return text.replace("\n", " ").replace("\r", " ")


def live_view(snapshot, policy: str) -> Group:
    """The decode slots, the request being prefilled, and the finished requests."""
    slots = Table(title=f"decode slots (step {snapshot.step}, {policy})", expand=True)
    slots.add_column("slot", justify="right")
    slots.add_column("request", justify="right")
    slots.add_column("priority")
    slots.add_column("position", justify="right")
    slots.add_column("generated", justify="right")
    slots.add_column("text so far", ratio=1, no_wrap=True, overflow="ellipsis")
    for number, view in enumerate(snapshot.slots):
        if view is None:
            slots.add_row(str(number), "-", "", "", "", Text("(free)", style="dim"))
        else:
            slots.add_row(
                str(number),
                f"#{view.request}",
                view.priority,
                str(view.offset),
                str(view.generated),
                one_line(view.text_tail),
            )
    progress = Table.grid(padding=(0, 1))
    progress.add_column(width=12)
    progress.add_column(width=40)
    progress.add_column()
    if snapshot.prefilling is None:
        progress.add_row("prefilling", "", Text("-", style="dim"))
    else:
        request, offset, prompt_tokens = snapshot.prefilling
        progress.add_row(
            "prefilling",
            ProgressBar(total=prompt_tokens, completed=offset),
            f"#{request}: {offset}/{prompt_tokens} prompt tokens",
        )
    progress.add_row(
        "finished",
        ProgressBar(total=snapshot.total, completed=snapshot.finished),
        f"{snapshot.finished}/{snapshot.total} requests",
    )
    return Group(slots, progress)


def print_summary(results, console: Console, policy: str) -> None:
    table = Table(title="results", expand=True)
    table.add_column("#", justify="right")
    table.add_column("finish")
    table.add_column("prompt", justify="right")
    table.add_column("tokens", justify="right")
    table.add_column("TTFT", justify="right")
    table.add_column("answer", ratio=1, no_wrap=True, overflow="ellipsis")
    for number, result in enumerate(results):
        ttft = result.metrics.time_to_first_token
        answer = result.error if result.error else one_line(result.text)
        table.add_row(
            str(number),
            result.finish_reason,
            str(result.metrics.prompt_tokens),
            str(len(result.tokens)),
            "-" if ttft is None else f"{ttft:.2f} s",
            answer,
        )
    console.print(table)
    metrics = results.metrics
    prompt_tokens = sum(r.metrics.prompt_tokens for r in results)
    generated = sum(len(r.tokens) for r in results)
    seconds = max(metrics.total_seconds, 1e-9)  # 0 when every prompt failed at once
    console.print(
        f"{len(results)} requests in {metrics.total_seconds:.1f} s: "
        f"{prompt_tokens} prompt tokens ({prompt_tokens / seconds:.1f} tokens/s), "
        f"{generated} generated tokens ({generated / seconds:.1f} tokens/s); "
        f"{policy}: {metrics.prefill_chunks} prefill chunks, "
        f"{metrics.decode_steps} decode steps, "
        f"longest decode stall {1000 * metrics.longest_decode_stall:.0f} ms, "
        f"peak memory {metrics.peak_memory_bytes / 2**20:.0f} MiB",
        highlight=False,
    )
    if metrics.kv_blocks_total:
        console.print(
            f"paged KV: peak {metrics.kv_peak_blocks_in_use} of "
            f"{metrics.kv_blocks_total} blocks of {metrics.kv_block_size} "
            f"({metrics.kv_peak_tokens} positions of a "
            f"{metrics.kv_blocks_total * metrics.kv_block_size:,}-token budget, "
            f"{metrics.kv_peak_tokens * metrics.kv_bytes_per_token / 2**20:.1f} MiB) "
            f"against {metrics.kv_dense_tokens} dense "
            f"({100 * metrics.kv_peak_tokens / metrics.kv_dense_tokens:.0f}%); "
            f"prefix cache hit rate {100 * metrics.prefix_cache_hit_rate:.0f}% "
            f"({metrics.prefix_cached_tokens} of {metrics.prefix_prompt_tokens} "
            f"prompt tokens); {metrics.preemptions} preemptions",
            highlight=False,
        )
    if metrics.drafts:
        console.print(
            f"speculative decoding: {metrics.draft_tokens} draft tokens in "
            f"{metrics.drafts} verifications, {metrics.accepted_draft_tokens} accepted "
            f"({100 * metrics.draft_acceptance_rate:.0f}%), mean accepted length "
            f"{metrics.mean_accepted_length:.2f} tokens a step",
            highlight=False,
        )


def print_failures(results) -> int:
    """Each failed request's whole error on stderr (the table cuts it); their count."""
    failed = [(n, r) for n, r in enumerate(results) if r.finish_reason == "error"]
    for number, result in failed:
        print(f"request #{number} failed: {result.error}", file=sys.stderr)
    return len(failed)
