"""The engine end to end against mlx-lm's generation loops, and a paged decode step
whose rows differ in length, side by side in one run.

    pdm run bench-engine [--quick] [--repeats 3] [--tokens 48] [--out FILE]

1. Generated tokens/s, greedy chat prompts (EOS never picked), --tokens each, the
   same float32 weights: ours (batch_generate's loop over the Engine under the mixed
   policy, serve's, which prefills the waiting prompts in one forward as
   BatchGenerator does; the default: decode forwards started a step ahead), ours in
   sequence (the same engine with step_ahead=False: every step read before the next
   starts), mlx-lm (stream_generate at batch 1, BatchGenerator at batch 8) on
   OpenBLAS alone, as it runs without tiny-llm, and mlx-lm on our kernels (the
   few-row products of gemv_forward.c, which every model in this process gets),
   interleaved --repeats rounds; and the step timeline: a decode step of the engine
   against the model's forward alone at that batch, the rest being the time
   outside the forward (planning, sampling, accepting, detokenizing).
   Beside them, model bandwidth utilization (benchlib/roofline.py): the bytes a
   decode step reads (the float32 weights, and the rows' float32 keys and values
   at the mean context) times steps per second (ours' decode steps: one over their
   median; ours end to end: tokens/s over the batch, the prefill included; the
   forward alone: one over its time) over the read bandwidth measured in the same
   run, one thread's or every core's, the larger. And llama.cpp at
   batch 1 on the embedded model's own GGUF, where it is installed
   (benchlib/llama_cpp_peer.py; where not, one line says how to get it).
2. A paged decode step with one --long-row row and three 200-token rows against
   the long row alone, with rows grouped by length (the reference) and gathered to
   the longest row (padded, the baseline), interleaved, the least of at least 7
   (other work on the machine only adds time);
   and the floor: the long row alone plus what 4 short rows cost over 1 (the
   batch's projections and logits, which no attention can save). Where OpenBLAS
   runs the matmuls (a thread per core, its default), the same steps and floor on
   one thread as a baseline.
Goals: ours / mlx-lm (on OpenBLAS alone) at least 1.1 at batch 1 and 1.3 at batch
8 with identical tokens, and mlx-lm's own tokens the same on both BLAS paths; ours'
decode steps at batch 1 at least 0.5 MBU (issue 44 asks it of decode; the end-to-end
figure, where the 37-token prefill is a twelfth of the time, is printed beside); the
mixed step at most 1.25x the long row alone.
"""

from scripts.commands.interrupt import exit_on_interrupt

exit_on_interrupt()  # first: Ctrl-C during the imports below never shows a traceback

import tiny_llm_base  # noqa: F401  (first: loads the fast BLAS before mlx.core)

# isort: split
import statistics

from scripts.bench.benchlib import engine_speed as es
from scripts.bench.benchlib import llama_cpp_peer
from scripts.bench.benchlib import paged_step as ps
from scripts.bench.benchlib.course import run_benchmark
from scripts.bench.benchlib.harness import Bench
from scripts.bench.benchlib.goals import at_least, same_tokens
from scripts.bench.benchlib.harness import interleaved, medians
from scripts.bench.benchlib.prompt_texts import SHORT_QUESTIONS
from scripts.bench.benchlib.roofline import Bandwidth, bytes_per_step, mbu
from scripts.bench.benchlib.roofline import measure_bandwidth
from scripts.commands.cli import fail, require_at_least
from scripts.commands.model_loading import context_length
from tiny_llm_base.embedded_model import gguf_path
from tiny_llm_base.fast_blas import openblas_alone

# ours / mlx-lm's tokens/s by batch (issue 44); ours' decode steps' MBU at batch 1.
RATIO_GOALS = {1: 1.1, 8: 1.3}
MBU_GOAL = 0.5


def end_to_end(
    bench, models, args, batch: int, bandwidth: Bandwidth
) -> tuple[dict, list]:
    """One table row per batch size: each contender's median tokens/s, ours over
    mlx-lm, the step timeline, ours' MBU (end to end, decode steps, the forward
    alone); and its goals."""
    tok, sampler = models.tokenizer, models.no_eos
    prompts = es.chat_prompts(tok, SHORT_QUESTIONS[:batch])
    ours, peer, n = models.float32, models.peer, args.tokens
    # The positions a decode step attends to, on average over the run.
    context = round(statistics.mean(map(len, prompts)) + n / 2)
    jobs = {
        "ours": lambda: es.run_ours(ours, tok, prompts, n, sampler, step_ahead=True),
        "ours in sequence": lambda: es.run_ours(
            ours, tok, prompts, n, sampler, step_ahead=False
        ),
        "mlx-lm": lambda: peer_alone(peer, tok, prompts, n, sampler),
        "mlx-lm, our kernels": lambda: es.run_mlx_lm(peer, tok, prompts, n, sampler),
        "forward": lambda: es.forward_alone(ours, batch, context),
    }
    for job in jobs.values():  # warm-up
        job()
    runs = interleaved(jobs, args.repeats, console=bench.console)
    alone = statistics.median(runs.pop("forward"))
    speed = {c: [r.tokens_per_s() for r in rs] for c, rs in runs.items()}
    ratio = [a / b for a, b in zip(speed["ours"], speed["mlx-lm"])]
    kernels_ratio = [a / b for a, b in zip(speed["ours"], speed["mlx-lm, our kernels"])]
    step = {
        c: statistics.median(s for r in runs[c] for s in r.decode_steps)
        for c in ("ours", "ours in sequence")
    }
    tokens_per_s, step_bytes = medians(speed), bytes_per_step(peer, context, batch)
    used = {
        "end to end": mbu(step_bytes, tokens_per_s["ours"] / batch, bandwidth.best),
        "decode steps": mbu(step_bytes, 1 / step["ours"], bandwidth.best),
        "forward alone": mbu(step_bytes, 1 / alone, bandwidth.best),
    }
    row = dict(
        batch=batch,
        tokens_per_s=tokens_per_s,
        ours_over_mlx_lm=ratio,
        ours_over_mlx_lm_our_kernels=kernels_ratio,
        step_ms={c: 1e3 * s for c, s in step.items()},
        forward_alone_ms=1e3 * alone,
        mean_context=context,
        bytes_per_step=step_bytes,
        mbu=used,
    )
    peer_name = "stream_generate" if batch == 1 else "BatchGenerator"
    outside = {c: f"{1e3 * (t - alone):.1f}" for c, t in step.items()}
    why = (
        f"median of {len(ratio)} rounds; a decode step {1e3 * step['ours']:.1f} ms "
        f"against the forward alone {1e3 * alone:.1f} ms (in sequence: "
        f"{1e3 * step['ours in sequence']:.1f} ms): outside the forward "
        f"{outside['ours']} ms (in sequence {outside['ours in sequence']} ms); "
        f"against mlx-lm on our kernels {statistics.median(kernels_ratio):.2f}x"
    )
    goals = [
        at_least(
            f"tokens/s ours / mlx-lm {peer_name}, batch {batch}",
            statistics.median(ratio),
            RATIO_GOALS[batch],
            why,
        ),
        same_tokens(
            f"tokens equal to mlx-lm's, batch {batch}",
            runs["ours"][0].tokens,
            runs["mlx-lm"][0].tokens,
        ),
        same_tokens(
            f"mlx-lm's tokens equal on our kernels and on OpenBLAS alone, batch {batch}",
            runs["mlx-lm, our kernels"][0].tokens,
            runs["mlx-lm"][0].tokens,
        ),
    ]
    if batch == 1:
        goals.append(
            at_least(
                "MBU of ours' decode steps, batch 1",
                used["decode steps"],
                MBU_GOAL,
                f"end to end (the prefill included) {used['end to end']:.2f}, the "
                f"forward alone {used['forward alone']:.2f}; {outside['ours']} ms "
                f"a step outside the forward ({step_bytes / 1e6:.0f} MB a step, "
                f"{bandwidth.best / 1e9:.1f} GB/s)",
            )
        )
    return row, goals


def peer_alone(peer, tokenizer, prompts, max_tokens, sampler) -> es.Generated:
    """mlx-lm with every product on OpenBLAS's sgemm: as it runs without tiny-llm's
    few-row kernel (gemv_forward.c)."""
    with openblas_alone():
        return es.run_mlx_lm(peer, tokenizer, prompts, max_tokens, sampler)


def llama_cpp(bench, models, args, ours_tokens_per_s: float) -> dict:
    """llama.cpp's batch-1 entry of the record, and its line beside ours; where it
    is not installed, the line says how to get it."""
    found = llama_cpp_peer.find(bench.console.print)
    if found is None:
        return llama_cpp_peer.not_installed()
    prompt = es.chat_prompts(models.tokenizer, SHORT_QUESTIONS[:1])[0]
    with bench.console.status(f"llama.cpp ({found.via})"):
        entry = llama_cpp_peer.measure(
            found, gguf_path(), prompt, args.tokens, args.repeats
        )
    bench.console.print(llama_cpp_peer.line(entry, ours_tokens_per_s))
    return entry


def main() -> int:
    bench = Bench(
        __doc__,
        quick=True,
        out="bench-results/engine.json",
        repeats=(3, "interleaved rounds"),
    )
    bench.option("--tokens", 48, "tokens per prompt", least=1)
    bench.option(
        "--long-row", None, "the long row's tokens (6,000; 2,000 quick)", type=int
    )
    args = bench.parse()
    if args.quick:
        args.repeats, args.tokens = 1, 16
    if args.long_row is None:
        args.long_row = 2000 if args.quick else 6000
    require_at_least(args, ps.SHORT_ROWS[0], "--long-row")
    console = bench.start()
    models = bench.models()
    context = context_length(models.mlx_model)
    if args.long_row + ps.ROOM > context:
        fail(
            f"--long-row {args.long_row} and {ps.ROOM} decode steps pass the model's context of {context}: give at most {context - ps.ROOM}"
        )
    with console.status("moving our weights onto huge pages"):
        models.float32  # noqa: B018  (built here, before anything is timed)
    console.print(
        f"our weights on 2 MB pages: {models.huge_page_bytes / 1e6:.0f} MB "
        "(tiny_llm_base/huge_pages.py; mlx-lm's stay on 4 KB pages)"
    )
    with console.status("measuring memory bandwidth"):
        bandwidth = measure_bandwidth()
    console.print(bandwidth.line())
    rows, goals = [], []
    for batch in (1, 8):
        row, batch_goals = end_to_end(bench, models, args, batch, bandwidth)
        console.print(f"batch {batch}: {row}")
        rows.append(row)
        goals += batch_goals
    columns = {"batch": lambda r: str(r["batch"])}
    for c in ("ours", "ours in sequence", "mlx-lm", "mlx-lm, our kernels"):
        columns[c] = lambda r, c=c: f"{r['tokens_per_s'][c]:.1f}"
    columns |= {
        "ours / mlx-lm (our kernels)": lambda r: (
            f"{statistics.median(r['ours_over_mlx_lm']):.2f}x "
            f"({statistics.median(r['ours_over_mlx_lm_our_kernels']):.2f}x)"
        ),
        "decode step ms (ours, in sequence)": lambda r: ", ".join(
            f"{r['step_ms'][c]:.1f}" for c in ("ours", "ours in sequence")
        ),
        "forward alone ms": lambda r: f"{r['forward_alone_ms']:.1f}",
        "MB a step": lambda r: f"{r['bytes_per_step'] / 1e6:.0f}",
        "MBU (end to end, decode steps, forward alone)": lambda r: ", ".join(
            f"{r['mbu'][c]:.2f}"
            for c in ("end to end", "decode steps", "forward alone")
        ),
    }
    title = f"generated tokens/s, {args.tokens} tokens a prompt (medians)"
    bench.table(title, columns, rows)
    peer = llama_cpp(bench, models, args, rows[0]["tokens_per_s"]["ours"])
    paged_record, paged_goals = ps.step_part(
        bench, models.float32, args.long_row, args.repeats
    )
    return bench.finish(
        dict(
            huge_page_bytes=models.huge_page_bytes,
            bandwidth=bandwidth.record(),
            end_to_end=rows,
            llama_cpp=peer,
            paged_step=paged_record,
        ),
        goals + paged_goals,
    )


if __name__ == "__main__":
    run_benchmark(main)
