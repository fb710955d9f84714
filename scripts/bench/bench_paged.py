"""The paged KV cache against the dense one and mlx-lm, in one run: `pdm run bench-paged`.

pdm run bench-paged            # every part, the goals met or missed
pdm run bench-paged --quick    # smaller workloads, same parts

Four parts, each on the embedded model, same weights and workload for every runner:
- step: one mixed step (4 decodes + a 32-token chunk), dense, and paged with the
  pool's arrays at 256 and at 4,096 blocks. Goal: 4,096 blocks within 10% of 256
  blocks and within 10% of dense.
- soak: the serving soak's workload (short chat questions, 10% long notes) at batch
  4 and max_seq_len 4096, dense against paged at its default budget. Goal: paged
  peak MLX memory no higher than dense, same tokens.
- budget: one KV budget of 4 x max_seq_len positions; dense fits batch_size 4 in it,
  paged runs batch_size 16 in the same bytes, on long and short prompts. Goal: at
  least 2x the requests decoding at once, same tokens.
- chat: a 10-turn chat replayed, each turn resending the conversation; ours with
  prefix caching (and without, for scale) beside mlx-lm's LRUPromptCache. Goals: at
  least 90% of the reusable prompt tokens from the cache, turn 10's time to first
  token within 1.3x turn 2's (each the median of the replays).
Writes a table per part, JSON (--json) and plots (book/src/images/week3-02-*.png).
"""

import json
import os
import statistics
import time
from pathlib import Path

import tiny_llm_base  # noqa: F401  (first: the fast BLAS before mlx.core)
import mlx.core as mx
from mlx_lm.server import LRUPromptCache
from rich.console import Console
from rich.table import Table

from scripts.bench.bench_prefix_cache import Result, chat, mlx_lm_one
from scripts.bench.loadlib.workload import make_workload
from scripts.bench.benchlib.course import add_option, course, run_benchmark, use
from scripts.commands.cli import option_parser
from tiny_llm_base import PromptSpec, load_model
from tiny_llm_base.memory import kv_bytes_per_token
from tiny_llm_base.mlx_lm_reference import float32_copy, greedy_without

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ROOT / "book" / "src" / "images"
CHAT_TURNS = [
    "Tell me about lighthouses.",
    "Why were they painted in stripes?",
    "Who kept them running?",
    "How did the keepers get food?",
    "What did a keeper do on a stormy night?",
    "Which lighthouse is the oldest still standing?",
    "How far can its light be seen?",
    "What replaced the oil lamps?",
    "Are any lighthouses still staffed?",
    "Give me one sentence to remember them by.",
]


def run_to_end(engine, specs: list[PromptSpec], on_step=None) -> list:
    """Every spec through the engine; results in the order added."""
    ids = [engine.add_request(spec) for spec in specs]
    results = {}
    while engine.has_unfinished():
        for output in engine.step():
            if output.result is not None:
                results[output.request_id] = output.result
        if on_step is not None:
            on_step(engine)
    return [results[i] for i in ids]


# --- step: a mixed step's time against the pool's size ----------------------------


def step_seconds(model, tokenizer, sampler, kv_cache: str, pool_blocks: int | None):
    """The median wall time of the mixed steps that feed 4 decodes and a 32-token
    chunk. With pool_blocks, the paged pool's arrays are grown to that many blocks
    first (as a long-running server's would be)."""
    settings = dict(num_blocks=4096, prefix_caching=False) if pool_blocks else {}
    engine = course.Engine(
        model,
        tokenizer,
        batch_size=5,
        max_seq_len=1024,
        prefill_step=32,
        policy="mixed",
        kv_cache=kv_cache,
        sampler=sampler,
        **settings,
    )
    short = [chat(tokenizer, [{"role": "user", "content": q}]) for q in CHAT_TURNS[:4]]
    for prompt in short:
        engine.add_request(PromptSpec(prompt, max_tokens=400))
    while len(engine.planner.decoding()) < 4:
        engine.step()
    if pool_blocks:
        for layer in engine.kv.layer_blocks:
            _, H, _, D = layer.keys.shape
            layer.grow(pool_blocks, H, D, layer.keys.dtype)
        mx.eval(
            [a for layer in engine.kv.layer_blocks for a in (layer.keys, layer.values)]
        )
    engine.add_request(PromptSpec(long_prompt(tokenizer, 700), max_tokens=1))
    times = []
    while len(times) < 16:
        start = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - start)
    return statistics.median(times[2:])


def long_prompt(tokenizer, tokens: int) -> list[int]:
    """A chat prompt of about `tokens` tokens: numbered notes and a question."""
    notes = "\n".join(
        f"Note {n}: the harbour light at pier {n % 7} was checked at {n % 12} o'clock."
        for n in range(tokens // 20)
    )
    return chat(tokenizer, [{"role": "user", "content": notes + "\nSummarize."}])


def step_part(model, tokenizer, sampler, repeats: int) -> dict:
    runners = {"dense": ("dense", None), "paged, 256 blocks": ("paged", 256)}
    runners["paged, 4,096 blocks"] = ("paged", 4096)
    seconds = {name: [] for name in runners}
    for _ in range(repeats):  # interleaved, so drift hits every runner alike
        for name, (kv_cache, blocks) in runners.items():
            seconds[name].append(
                step_seconds(model, tokenizer, sampler, kv_cache, blocks)
            )
    medians = {name: statistics.median(values) for name, values in seconds.items()}
    big, small = medians["paged, 4,096 blocks"], medians["paged, 256 blocks"]
    return dict(
        seconds=medians,
        goals=[
            goal(
                "paged step at 4,096 blocks within 10% of 256 blocks", big / small, 1.1
            ),
            goal(
                "paged step at 4,096 blocks within 10% of dense",
                big / medians["dense"],
                1.1,
            ),
        ],
    )


# --- soak: peak memory on the serving soak's workload -----------------------------


def soak_specs(tokenizer, count: int, max_tokens: int) -> list[PromptSpec]:
    workload = make_workload(count, 1.0, max_tokens, long_fraction=0.1, seed=11)
    return [
        PromptSpec(
            chat(tokenizer, [{"role": "user", "content": r.question}]),
            max_tokens=r.max_tokens,
        )
        for r in workload
    ]


def peak_memory_run(model, tokenizer, specs, **settings) -> tuple[int, list]:
    """MLX's peak memory above the start while the specs run, and their tokens."""
    mx.clear_cache()
    mx.reset_peak_memory()
    start = mx.get_active_memory()
    engine = course.Engine(model, tokenizer, **settings)
    results = run_to_end(engine, specs)
    peak = mx.get_peak_memory() - start
    del engine
    mx.clear_cache()
    return peak, [r.tokens for r in results]


def soak_part(model, tokenizer, count: int) -> dict:
    specs = soak_specs(tokenizer, count, 48)
    shared = dict(batch_size=4, max_seq_len=4096, prefill_step=128, policy="mixed")
    dense, dense_tokens = peak_memory_run(
        model, tokenizer, specs, kv_cache="dense", **shared
    )
    paged, paged_tokens = peak_memory_run(
        model, tokenizer, specs, kv_cache="paged", **shared
    )
    same = dense_tokens == paged_tokens
    return dict(
        requests=count,
        peak_bytes={"dense": dense, "paged": paged},
        goals=[
            goal("soak: paged peak memory no higher than dense", paged / dense, 1.0),
            dict(goal="soak: the same tokens dense and paged", value=same, met=same),
        ],
    )


# --- budget: requests running at once in the same bytes --------------------------


def budget_part(model, tokenizer, sampler, short_count: int) -> dict:
    max_seq_len = 1024
    per_token = kv_bytes_per_token(model)
    budget = 4 * max_seq_len * per_token
    prompts = [long_prompt(tokenizer, 600), long_prompt(tokenizer, 700)] + [
        chat(tokenizer, [{"role": "user", "content": q}])
        for q in soak_questions(short_count)
    ]
    specs = [PromptSpec(p, max_tokens=24, sampler=sampler) for p in prompts]
    runs = {}
    for name, kv_cache, batch_size in (("dense", "dense", 4), ("paged", "paged", 16)):
        decoding = []
        engine = course.Engine(
            model,
            tokenizer,
            batch_size=batch_size,
            max_seq_len=max_seq_len,
            prefill_step=128,
            policy="mixed",
            kv_cache=kv_cache,
            kv_memory=budget,
        )
        start = time.perf_counter()
        results = run_to_end(
            engine,
            specs,
            lambda e, seen=decoding: seen.append(len(e.planner.decoding())),
        )
        runs[name] = dict(
            batch_size=batch_size,
            most_decoding=max(decoding),
            decoding=decoding,
            seconds=time.perf_counter() - start,
            preemptions=engine.metrics.preemptions,
            tokens=[r.tokens for r in results],
        )
    ratio = runs["paged"]["most_decoding"] / runs["dense"]["most_decoding"]
    same = runs["paged"]["tokens"] == runs["dense"]["tokens"]
    return dict(
        budget_bytes=budget,
        budget_tokens=4 * max_seq_len,
        runs=runs,
        goals=[
            dict(
                goal="budget: paged decodes at least 2x the requests at once",
                value=ratio,
                met=ratio >= 2,
            ),
            dict(goal="budget: the same tokens dense and paged", value=same, met=same),
        ],
    )


def soak_questions(count: int) -> list[str]:
    return [r.question for r in make_workload(count, 1.0, 8, long_fraction=0.0, seed=5)]


# --- chat: a 10-turn replay ---------------------------------------------------------


def common_prefix(a: list[int], b: list[int]) -> int:
    return next(
        (i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b))
    )


def chat_engine(model, tokenizer, caching: bool, max_tokens: int) -> dict:
    """One replay through a paged Engine. Per turn: TTFT, tokens found cached, and the
    reusable tokens: the prompt's common prefix with everything the previous turn
    computed (its prompt and all but its last generated token), never the prompt's
    last token (always computed)."""
    engine = course.Engine(
        model,
        tokenizer,
        batch_size=4,
        max_seq_len=4096,
        prefill_step=512,
        policy="mixed",
        kv_cache="paged",
        prefix_caching=caching,
    )
    messages, computed = [], []
    turns = dict(ttft=[], cached=[], reusable=[], tokens=[])
    for question in CHAT_TURNS:
        messages.append({"role": "user", "content": question})
        prompt = chat(tokenizer, messages)
        [result] = run_to_end(engine, [PromptSpec(prompt, max_tokens=max_tokens)])
        turns["ttft"].append(result.metrics.time_to_first_token)
        turns["cached"].append(result.metrics.cached_tokens)
        turns["reusable"].append(min(common_prefix(prompt, computed), len(prompt) - 1))
        turns["tokens"].append(result.tokens)
        computed = prompt + result.tokens[:-1]
        messages.append({"role": "assistant", "content": result.text})
    return turns


def chat_mlx_lm(mlx_model, tokenizer, max_tokens: int) -> dict:
    """The same replay through mlx-lm's generate_step and its server's LRUPromptCache."""
    lru, result = LRUPromptCache(), Result("mlx-lm")
    messages, computed = [], []
    turns = dict(ttft=[], cached=[], reusable=[], tokens=[])
    eos = set(tokenizer.eos_token_ids)
    for question in CHAT_TURNS:
        messages.append({"role": "user", "content": question})
        prompt = chat(tokenizer, messages)
        before = result.cached_tokens
        tokens = mlx_lm_one(mlx_model, prompt, max_tokens, lru, result)
        turns["ttft"].append(result.ttft[-1])
        turns["cached"].append(result.cached_tokens - before)
        turns["reusable"].append(min(common_prefix(prompt, computed), len(prompt) - 1))
        turns["tokens"].append(tokens)
        computed = prompt + tokens[:-1]
        text = tokenizer.decode([t for t in tokens if t not in eos])
        messages.append({"role": "assistant", "content": text})
    return turns


def chat_part(model, mlx_model, tokenizer, replays: int, max_tokens: int) -> dict:
    runners = {
        "ours, caching on": lambda: chat_engine(model, tokenizer, True, max_tokens),
        "ours, caching off": lambda: chat_engine(model, tokenizer, False, max_tokens),
        "mlx-lm, LRUPromptCache": lambda: chat_mlx_lm(mlx_model, tokenizer, max_tokens),
    }
    runs = {name: [] for name in runners}
    for _ in range(replays):
        for name, run in runners.items():
            runs[name].append(run())
    summary = {}
    for name, replays_of in runs.items():
        first = replays_of[0]
        ttft = [
            statistics.median(r["ttft"][t] for r in replays_of)
            for t in range(len(CHAT_TURNS))
        ]
        reusable, cached = sum(first["reusable"][1:]), sum(first["cached"][1:])
        summary[name] = dict(
            ttft=ttft,
            cached=first["cached"],
            reusable=first["reusable"],
            hit=cached / reusable if reusable else 0.0,
            turn10_over_turn2=ttft[-1] / ttft[1],
            tokens=first["tokens"],
        )
    ours = summary["ours, caching on"]
    same = ours["tokens"] == summary["ours, caching off"]["tokens"]
    return dict(
        turns=summary,
        goals=[
            dict(
                goal="chat: at least 90% of reusable prompt tokens cached (turns 2-10)",
                value=ours["hit"],
                met=ours["hit"] >= 0.9,
            ),
            goal(
                "chat: turn 10's TTFT within 1.3x turn 2's",
                ours["turn10_over_turn2"],
                1.3,
            ),
            dict(
                goal="chat: the same tokens with caching on and off",
                value=same,
                met=same,
            ),
        ],
    )


# --- report -------------------------------------------------------------------------


def goal(text: str, value: float, at_most: float) -> dict:
    return dict(goal=f"{text} (at most {at_most:g})", value=value, met=value <= at_most)


def tables(console: Console, step: dict, soak: dict, budget: dict, chats: dict) -> None:
    out = Table(title="step: 4 decodes + a 32-token chunk, one mixed step")
    out.add_column("runner")
    out.add_column("median step", justify="right")
    for name, seconds in step["seconds"].items():
        out.add_row(name, f"{1000 * seconds:.0f} ms")
    console.print(out)
    out = Table(title=f"soak: {soak['requests']} requests at batch 4, max_seq_len 4096")
    out.add_column("runner")
    out.add_column("peak MLX memory above the start", justify="right")
    for name, peak in soak["peak_bytes"].items():
        out.add_row(name, f"{peak / 2**20:,.0f} MiB")
    console.print(out)
    out = Table(
        title=f"budget: {budget['budget_bytes'] / 2**20:,.0f} MiB = "
        f"{budget['budget_tokens']:,} tokens, 2 long + short prompts"
    )
    for column in (
        "runner",
        "batch_size",
        "most decoding at once",
        "preemptions",
        "total",
    ):
        out.add_column(column, justify="left" if column == "runner" else "right")
    for name, run in budget["runs"].items():
        out.add_row(
            name,
            str(run["batch_size"]),
            str(run["most_decoding"]),
            str(run["preemptions"]),
            f"{run['seconds']:.1f} s",
        )
    console.print(out)
    out = Table(title="chat: a 10-turn replay (TTFT: median of the replays)")
    for column in (
        "runner",
        "hit (turns 2-10)",
        "TTFT turn 2",
        "TTFT turn 10",
        "10 / 2",
    ):
        out.add_column(column, justify="left" if column == "runner" else "right")
    for name, run in chats["turns"].items():
        out.add_row(
            name,
            f"{100 * run['hit']:.0f}%",
            f"{1000 * run['ttft'][1]:.0f} ms",
            f"{1000 * run['ttft'][-1]:.0f} ms",
            f"{run['turn10_over_turn2']:.2f}",
        )
    console.print(out)


def plot(step: dict, soak: dict, budget: dict, chats: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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


def main() -> int:
    parser = option_parser(__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller workloads")
    parser.add_argument("--json", default="bench-results/paged.json")
    add_option(parser)
    args = parser.parse_args()
    use(args)
    console = Console(width=150)
    mlx_model, tokenizer = load_model()
    served = course.Qwen2ModelWeek2(
        mlx_model, use_fast_kernels=True
    )  # as main and serve
    exact = course.Qwen2ModelWeek2(mlx_model, weights="float32", use_fast_kernels=True)
    reference = float32_copy(mlx_model)
    sampler = greedy_without(tokenizer.eos_token_ids, served.vocab_size)
    step = step_part(served, tokenizer, sampler, 1 if args.quick else 3)
    soak = soak_part(served, tokenizer, 12 if args.quick else 32)
    budget = budget_part(served, tokenizer, sampler, 10 if args.quick else 14)
    chats = chat_part(exact, reference, tokenizer, 1 if args.quick else 3, 32)
    tables(console, step, soak, budget, chats)
    met = step["goals"] + soak["goals"] + budget["goals"] + chats["goals"]
    for g in met:
        value = g["value"]
        shown = f"{value:.2f}" if isinstance(value, float) else str(value)
        console.print(f"{'MET   ' if g['met'] else 'MISSED'} {g['goal']}: {shown}")
    suffix = "-quick" if args.quick else ""
    IMAGES.mkdir(parents=True, exist_ok=True)
    image = IMAGES / f"week3-02-paged{suffix}.png"
    plot(step, soak, budget, chats, image)
    record = dict(
        meta=dict(
            quick=args.quick, cpus=os.cpu_count(), device=str(mx.default_device())
        ),
        step=step,
        soak=soak,
        budget={
            **budget,
            "runs": {
                k: {x: y for x, y in v.items() if x != "tokens"}
                for k, v in budget["runs"].items()
            },
        },
        chat={
            name: {k: v for k, v in run.items() if k != "tokens"}
            for name, run in chats["turns"].items()
        },
        goals=met,
    )
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(record, indent=2, default=str))
    console.print(f"wrote {args.json} and {image.relative_to(ROOT)}")
    return 0 if all(g["met"] for g in met) else 1


if __name__ == "__main__":
    run_benchmark(main)
