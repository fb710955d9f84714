"""What does the prefill chunk size buy, and what does it cost? Ours against mlx-lm.

    pdm run bench-chunked-prefill [--cases a,b] [--chunk-sizes 32,128,512,none]
                                  [--quick] [--repeats 1] [--out FILE]

Two workloads on the embedded SmolLM2, token-id prompts through its chat template:
- a (mixed): 3 long prompts of several hundred tokens among 10 short ones, batch 5,
  all queued at once;
- b (long context): 4 short requests are decoding when one ~2048-token prompt
  arrives; the short ones keep decoding through its whole prefill.

Each chunk size runs twice, side by side: `batch_generate` on
`Qwen2ModelWeek2(weights="float32", use_fast_kernels=True)`, and mlx-lm's own
`BatchGenerator` (completion batch 5, one prompt prefilled at a time,
`prefill_step_size` = the chunk size; "none" = longer than any prompt) on the SAME
float32 weights. EOS is masked out of the greedy sampler, so both engines do exactly
the same work: max_tokens for every request.

Both are timed the same way, on wall-clock timestamps of every generated token:
TTFT = arrival -> first token; inter-token latency = the gaps between a request's
tokens; longest stall = the largest gap of any request; throughput = tokens / total
run time; peak memory = MLX's peak during the run above what was in use before.
Writes a JSON file (--out, default bench-results/chunked_prefill.json) and a plot
next to it (.png). Nothing is asserted: the goals are reported.
"""

import tiny_llm_base  # noqa: F401  (first: loads the fast BLAS before mlx.core)

# isort: split
import argparse
import gc
import json
import os
import platform
import time
from dataclasses import asdict, dataclass, field
from itertools import pairwise
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten
from mlx_lm.generate import BatchGenerator
from rich.console import Console
from rich.table import Table

from tiny_llm_ref import PromptSpec, Qwen2ModelWeek2, batch_generate, load_model
from tiny_llm_base.fast_blas import STATUS
from tiny_llm_base import dequantize_linear

BATCH_SIZE = 5
SHORT_QUESTIONS = [
    "What is the capital of France?",
    "Name three primary colors.",
    "Why is the sky blue?",
    "Give me a synonym for happy.",
    "How many legs does a spider have?",
    "What does a compiler do?",
    "Suggest a name for a gray cat.",
    "What is 12 times 12?",
    "Who wrote Romeo and Juliet?",
    "What is the boiling point of water?",
]
NOTE_TOPICS = [
    "the river level",
    "the bakery queue",
    "the train delays",
    "the garden soil",
    "the library hours",
    "the bridge repairs",
    "the market prices",
    "the school concert",
]


@dataclass
class Workload:
    """Prompts (token ids), per-request max_tokens, arrival steps, which are short."""

    name: str
    prompts: list[list[int]]
    max_tokens: list[int]
    arrival_steps: list[int]
    short: list[bool]

    @property
    def max_seq_len(self) -> int:
        return max(len(p) + m for p, m in zip(self.prompts, self.max_tokens)) + 1


@dataclass
class Run:
    """One engine on one workload at one chunk size."""

    engine: str
    chunk: str
    total_s: float
    prompt_tokens: int
    generated_tokens: int
    ttft_short_p50_s: float
    ttft_short_p99_s: float
    ttft_long_s: list[float]
    itl_p50_ms: float
    itl_p99_ms: float
    longest_stall_s: float
    peak_memory_mb: float
    tokens: list[list[int]] = field(repr=False)
    requests: list[dict] = field(repr=False, default_factory=list)

    @property
    def prompt_tps(self) -> float:
        return self.prompt_tokens / self.total_s

    @property
    def generation_tps(self) -> float:
        return self.generated_tokens / self.total_s


def chat_ids(tokenizer, text: str) -> list[int]:
    return list(
        tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True
        )
    )


def long_prompt(tokenizer, tokens: int, seed: int) -> list[int]:
    """A chat prompt of about `tokens` tokens: numbered notes, then a question."""
    rng = np.random.default_rng(seed)
    notes = []
    while True:
        text = "\n".join(notes) + "\nWhich note surprised you most, and why?"
        ids = chat_ids(tokenizer, "Read my notes.\n" + text)
        if len(ids) >= tokens:
            return ids
        topic = NOTE_TOPICS[rng.integers(len(NOTE_TOPICS))]
        notes.append(
            f"Note {len(notes) + 1}: on day {rng.integers(1, 29)} {topic} changed by "
            f"{rng.integers(2, 90)} percent, after {rng.integers(1, 12)} quiet weeks."
        )


def mixed_workload(tokenizer, quick: bool) -> Workload:
    """Case a: long prompts queued among short ones, everything at step 0."""
    lengths = (120, 160, 200) if quick else (400, 500, 600)
    max_tokens = 8 if quick else 24
    shorts = [chat_ids(tokenizer, q) for q in SHORT_QUESTIONS]
    longs = [long_prompt(tokenizer, n, seed) for seed, n in enumerate(lengths)]
    prompts, short = [], []
    for i, ids in enumerate(shorts):
        if i % 3 == 0 and longs:
            prompts.append(longs.pop(0))
            short.append(False)
        prompts.append(ids)
        short.append(True)
    n = len(prompts)
    return Workload("a: mixed", prompts, [max_tokens] * n, [0] * n, short)


def long_context_workload(tokenizer, quick: bool) -> Workload:
    """Case b: 4 short requests decode; the long prompt arrives at step 12."""
    long_tokens, short_max_tokens = (512, 40) if quick else (2048, 110)
    prompts = [chat_ids(tokenizer, q) for q in SHORT_QUESTIONS[:4]]
    prompts.append(long_prompt(tokenizer, long_tokens, seed=7))
    return Workload(
        "b: long context",
        prompts,
        [short_max_tokens] * 4 + [16],
        [0, 0, 0, 0, 12],
        [True] * 4 + [False],
    )


def float32_mlx_lm_model(mlx_model):
    """mlx-lm's own model class with the float32 weights Qwen2ModelWeek2 uses."""
    params = dict(tree_flatten(mlx_model.parameters()))
    for name, module in mlx_model.named_modules():
        if "scales" in module:
            params[f"{name}.weight"] = dequantize_linear(module, mx.float32)
            del params[f"{name}.scales"]
            params.pop(f"{name}.biases", None)
    peer = type(mlx_model)(mlx_model.args)
    peer.load_weights([(k, v.astype(mx.float32)) for k, v in params.items()])
    mx.eval(peer.parameters())
    return peer


def no_eos_greedy(vocab: int, eos_ids):
    """Greedy over [B, V] log-probabilities, never EOS: every request runs to max_tokens."""
    mask = np.zeros(vocab, dtype=np.float32)
    mask[list(eos_ids)] = -np.inf
    mask = mx.array(mask)
    return lambda logprobs: mx.argmax(logprobs + mask, axis=-1)


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else 0.0


def summarize(
    engine: str,
    chunk: str,
    workload: Workload,
    total_s: float,
    arrivals: list[float],
    token_times: list[list[float]],
    tokens: list[list[int]],
    peak_bytes: int,
    start: float,
) -> Run:
    """The run's numbers from each request's arrival and token timestamps."""
    ttft = [times[0] - arrival for times, arrival in zip(token_times, arrivals)]
    gaps = [b - a for times in token_times for a, b in pairwise(times)]
    short_ttft = [t for t, short in zip(ttft, workload.short) if short]
    return Run(
        engine=engine,
        chunk=chunk,
        total_s=total_s,
        prompt_tokens=sum(len(p) for p in workload.prompts),
        generated_tokens=sum(len(t) for t in tokens),
        ttft_short_p50_s=percentile(short_ttft, 50),
        ttft_short_p99_s=percentile(short_ttft, 99),
        ttft_long_s=[t for t, short in zip(ttft, workload.short) if not short],
        itl_p50_ms=percentile(gaps, 50) * 1e3,
        itl_p99_ms=percentile(gaps, 99) * 1e3,
        longest_stall_s=max(gaps, default=0.0),
        peak_memory_mb=peak_bytes / 2**20,
        tokens=tokens,
        requests=[
            {
                "arrival_s": arrival - start,
                "first_token_s": times[0] - start,
                "last_token_s": times[-1] - start,
                "longest_gap_s": max((b - a for a, b in pairwise(times)), default=0.0),
                "tokens": len(times),
            }
            for arrival, times in zip(arrivals, token_times)
        ],
    )


def run_ours(model, tokenizer, workload: Workload, chunk: int | None, sampler) -> Run:
    specs = [
        PromptSpec(p, max_tokens=m, arrival_step=a)
        for p, m, a in zip(
            workload.prompts, workload.max_tokens, workload.arrival_steps
        )
    ]
    base = mx.get_active_memory()
    start = time.perf_counter()
    results = batch_generate(
        model,
        tokenizer,
        specs,
        batch_size=BATCH_SIZE,
        prefill_step=chunk,
        max_seq_len=workload.max_seq_len,
        sampler=sampler,
    )
    total = time.perf_counter() - start
    return summarize(
        "ours",
        chunk_name(chunk),
        workload,
        total,
        [r.metrics.arrival for r in results],
        [r.metrics.token_times for r in results],
        [r.tokens for r in results],
        results.metrics.peak_memory_bytes - base,
        start,
    )


def run_mlx_lm(peer, workload: Workload, chunk: int | None, sampler) -> Run:
    """The same workload through mlx-lm's BatchGenerator, one next() per iteration."""
    longest = max(len(p) for p in workload.prompts)
    generator = BatchGenerator(
        peer,
        sampler=sampler,
        completion_batch_size=BATCH_SIZE,
        prefill_batch_size=1,
        prefill_step_size=chunk or longest + 1,
    )
    n = len(workload.prompts)
    uid_of, arrivals = {}, [0.0] * n
    token_times: list[list[float]] = [[] for _ in range(n)]
    tokens: list[list[int]] = [[] for _ in range(n)]
    finished = 0
    mx.reset_peak_memory()
    base = mx.get_active_memory()
    start = time.perf_counter()
    step = 0
    while finished < n:
        arriving = [i for i in range(n) if workload.arrival_steps[i] == step]
        if arriving:
            now = time.perf_counter()
            uids = generator.insert(
                [workload.prompts[i] for i in arriving],
                [workload.max_tokens[i] for i in arriving],
            )
            for i, uid in zip(arriving, uids):
                uid_of[uid], arrivals[i] = i, now
        _, responses = generator.next()
        now = time.perf_counter()
        for response in responses:
            i = uid_of[response.uid]
            token_times[i].append(now)
            tokens[i].append(response.token)
            finished += response.finish_reason is not None
        step += 1
    total = time.perf_counter() - start
    peak = mx.get_peak_memory() - base
    generator.close()
    return summarize(
        "mlx-lm",
        chunk_name(chunk),
        workload,
        total,
        arrivals,
        token_times,
        tokens,
        peak,
        start,
    )


def run_record(run: Run) -> dict:
    """A run for the JSON file: its numbers, without the generated token ids."""
    return {k: v for k, v in asdict(run).items() if k != "tokens"}


def chunk_name(chunk: int | None) -> str:
    return "none" if chunk is None else str(chunk)


def median_run(runs: list[Run]) -> Run:
    return sorted(runs, key=lambda r: r.total_s)[len(runs) // 2]


def fresh() -> None:
    gc.collect()
    mx.clear_cache()


def render(workload: Workload, runs: list[Run]) -> Table:
    table = Table(
        title=f"case {workload.name}: {len(workload.prompts)} requests, "
        f"{sum(len(p) for p in workload.prompts)} prompt tokens, batch {BATCH_SIZE}"
    )
    columns = (
        "chunk",
        "engine",
        "total s",
        "prompt tok/s",
        "gen tok/s",
        "TTFT short p50/p99 s",
        "TTFT long s",
        "ITL p50/p99 ms",
        "longest stall s",
        "peak MB",
        "same tokens",
    )
    for column in columns:
        table.add_column(column, justify="left" if column == "engine" else "right")
    ours = {r.chunk: r for r in runs if r.engine == "ours"}
    for run in runs:
        same = sum(a == b for a, b in zip(run.tokens, ours[run.chunk].tokens))
        table.add_row(
            run.chunk,
            run.engine,
            f"{run.total_s:.2f}",
            f"{run.prompt_tps:.0f}",
            f"{run.generation_tps:.1f}",
            f"{run.ttft_short_p50_s:.2f} / {run.ttft_short_p99_s:.2f}",
            " ".join(f"{t:.2f}" for t in run.ttft_long_s),
            f"{run.itl_p50_ms:.0f} / {run.itl_p99_ms:.0f}",
            f"{run.longest_stall_s:.2f}",
            f"{run.peak_memory_mb:.0f}",
            "" if run.engine == "ours" else f"{same}/{len(run.tokens)}",
            end_section=run.engine == "mlx-lm",
        )
    return table


def goals(runs: list[Run]) -> list[str]:
    """Case b's goals: chunk 128 against no chunking, and against mlx-lm at 128."""
    by = {(r.engine, r.chunk): r for r in runs}
    lines = []
    chunked, whole = by.get(("ours", "128")), by.get(("ours", "none"))
    peer = by.get(("mlx-lm", "128"))
    if chunked and whole:
        ratio = whole.longest_stall_s / chunked.longest_stall_s
        extra = chunked.total_s / whole.total_s - 1
        lines.append(
            f"chunk 128 vs none: longest stall {ratio:.1f}x shorter (goal >= 5x: "
            f"{'met' if ratio >= 5 else 'missed'}), total time {extra:+.1%} "
            f"(goal <= +10%: {'met' if extra <= 0.10 else 'missed'})"
        )
    if chunked and peer:
        lines.append(
            f"vs mlx-lm at chunk 128: longest stall {chunked.longest_stall_s:.2f} s vs "
            f"{peer.longest_stall_s:.2f} s "
            f"({'met' if chunked.longest_stall_s <= peer.longest_stall_s else 'missed'}), "
            f"total {chunked.total_s:.2f} s vs {peer.total_s:.2f} s "
            f"({'met' if chunked.total_s <= peer.total_s else 'missed'})"
        )
    return lines


def plot(results: dict[str, list[Run]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = (
        ("longest_stall_s", "longest decode stall (s)"),
        ("total_s", "total time (s)"),
        ("generation_tps", "generation throughput (tok/s)"),
    )
    figure, axes = plt.subplots(
        len(results), len(metrics), figsize=(13, 3.6 * len(results)), squeeze=False
    )
    for row, (case, runs) in enumerate(results.items()):
        chunks = list(dict.fromkeys(r.chunk for r in runs))
        for col, (attribute, label) in enumerate(metrics):
            ax = axes[row][col]
            for engine, marker in (("ours", "o"), ("mlx-lm", "s")):
                values = {
                    r.chunk: getattr(r, attribute) for r in runs if r.engine == engine
                }
                ax.plot(
                    range(len(chunks)),
                    [values.get(c, np.nan) for c in chunks],
                    marker=marker,
                    label=engine,
                )
            ax.set_xticks(range(len(chunks)), chunks)
            ax.set_xlabel("prefill chunk size")
            ax.set_ylabel(label)
            ax.set_title(f"case {case}", fontsize=10)
            ax.set_ylim(bottom=0)
            ax.grid(alpha=0.3)
            ax.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def parse_chunks(text: str) -> list[int | None]:
    return [None if c.strip().lower() == "none" else int(c) for c in text.split(",")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="a,b", help="a, b or a,b")
    parser.add_argument("--chunk-sizes", default="32,128,512,none")
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    parser.add_argument("--repeats", type=int, default=1, help="keep the median run")
    parser.add_argument("--out", default="bench-results/chunked_prefill.json")
    args = parser.parse_args()
    chunks = parse_chunks(args.chunk_sizes)
    cases = [c.strip() for c in args.cases.split(",")]

    console = Console()
    if not console.is_terminal:  # keep tables whole when piped to a file
        console = Console(width=160)
    blas = f"OpenBLAS ({STATUS.library})" if STATUS.active else STATUS.hint
    console.print(
        f"mlx {mx.__version__} on {mx.default_device()}, {platform.machine()}, "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; {blas}"
    )
    mlx_model, tokenizer = load_model()
    model = Qwen2ModelWeek2(mlx_model, weights="float32", use_fast_kernels=True)
    peer = float32_mlx_lm_model(mlx_model)
    sampler = no_eos_greedy(mlx_model.args.vocab_size, tokenizer.eos_token_ids)
    makers = {"a": mixed_workload, "b": long_context_workload}
    workloads = [makers[c](tokenizer, args.quick) for c in cases]

    warmup = Workload("warm-up", [chat_ids(tokenizer, "Hi")], [4], [0], [True])
    run_ours(model, tokenizer, warmup, 8, sampler)
    run_mlx_lm(peer, warmup, 8, sampler)

    results: dict[str, list[Run]] = {}
    for workload in workloads:
        runs = []
        for chunk in chunks:
            for engine in ("ours", "mlx-lm"):
                with console.status(
                    f"case {workload.name}, chunk {chunk_name(chunk)}, {engine}"
                ):
                    repeats = []
                    for _ in range(args.repeats):
                        fresh()
                        if engine == "ours":
                            repeats.append(
                                run_ours(model, tokenizer, workload, chunk, sampler)
                            )
                        else:
                            repeats.append(run_mlx_lm(peer, workload, chunk, sampler))
                    runs.append(median_run(repeats))
        results[workload.name] = runs
        console.print(render(workload, runs))
        if workload.name.startswith("b"):
            for line in goals(runs):
                console.print(f"  goal: {line}")
    console.print(f"load average after the run: {os.getloadavg()[0]:.1f}")

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "mlx": mx.__version__,
                "device": str(mx.default_device()),
                "machine": platform.machine(),
                "cpus": os.cpu_count(),
                "blas": blas,
                "quick": args.quick,
                "repeats": args.repeats,
                "cases": {
                    case: [
                        {
                            **run_record(r),
                            "prompt_tps": r.prompt_tps,
                            "generation_tps": r.generation_tps,
                        }
                        for r in runs
                    ]
                    for case, runs in results.items()
                },
            },
            indent=2,
        )
    )
    plot(results, out.with_suffix(".png"))
    console.print(f"wrote {out} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
