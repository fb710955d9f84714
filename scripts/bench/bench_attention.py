"""Where a prefill chunk's step time goes over a long context, before and after
cpu_attention, and the goal it was made for.

    pdm run bench-attention [--positions 0 1000 2000 4000 8000] [--repeats 3]
                            [--decode-rows 4] [--long-prompt 2000] [--out FILE]

The embedded model in float32 on the fast path (use_fast_kernels=True), in one
process, side by side:
- before: the fast path as it was, mx.fast.scaled_dot_product_attention (a long
  causal chunk in blocks of 128 queries) and swiglu with mx.sigmoid;
- after: the reference now, cpu_attention for chunks and swiglu with fast_exp.

1. Breakdown: for a 128-token chunk at each position P (its cache filled with random
   keys and values up to P), each part of a layer timed alone at its real shapes
   (median of --repeats, after a warm-up, MLX's buffer cache raised so that it
   reuses memory as a step does) and multiplied by the 30 layers; then the whole
   step measured, before and after, and what the parts leave unexplained.
2. The goal: a mixed step (mixed_forward) with --decode-rows decoding rows and a
   128-token chunk at position 2,000, before and after, interleaved --repeats times
   (at least 3); met when the median after is at most half the median before.
3. Tokens: a few prompts (short questions and one of about --long-prompt tokens,
   0 to leave it out), each prefilled in 128-token chunks and then decoded greedily,
   before and after: the tokens must be equal, and the largest difference of the
   prompt's last logits is shown.
Goals: the speed-up of 2, the tokens unchanged. --out writes the numbers as JSON.
"""

from scripts.commands.interrupt import exit_on_interrupt

exit_on_interrupt()  # first: Ctrl-C during the imports below never shows a traceback

import tiny_llm_base  # noqa: F401  (first: loads the fast BLAS before mlx.core)

# isort: split
import math
import statistics
from collections.abc import Callable

import mlx.core as mx

from scripts.bench.benchlib.course import course, run_benchmark
from scripts.bench.benchlib.decoding import Decoder, greedy
from scripts.bench.benchlib.fast_path_before import (
    CHUNK,
    PATHS,
    before_and_after,
    filled_cache,
    previous_fast_attention,
    previous_swiglu,
    random_layer_cache,
    rewind,
)
from scripts.bench.benchlib.harness import Bench, medians, timed
from scripts.bench.benchlib.goals import at_least, identical
from scripts.bench.benchlib.render import grid
from scripts.bench.benchlib.workloads import long_prompt
from scripts.bench.benchlib.prompt_texts import SHORT_QUESTIONS
from scripts.commands.cli import fail, require_at_least
from tiny_llm_base.mlx_lm_reference import chat_ids

GOAL_POSITION = 2000
GOAL_SPEEDUP = 2.0
DECODE_TOKENS = 8
PARTS_CACHE_LIMIT = 1 << 30  # MLX's buffer cache while the parts are timed alone
# The parts each path has of its own; the others are shared.
OWN_PARTS = {
    "before": ["before: swiglu (mx.sigmoid)", "before: attention (mx.fast)"],
    "after": ["after: swiglu (fast_exp)", "after: attention (cpu_attention)"],
}


def median_ms(fn: Callable[[], object], repeats: int) -> float:
    """Median milliseconds of `repeats` evaluated calls, after one warm-up."""
    return 1e3 * statistics.median(timed(fn, repeats))


def layer_parts(model, position: int) -> dict[str, Callable[[], object]]:
    """Each part of one layer for a CHUNK-token chunk at `position`, as a zero-argument
    function on inputs of its real shapes."""
    block = model.layers[0]
    attention = block.attention
    H_q, H, D = attention.num_heads, attention.num_kv_heads, attention.head_dim
    E, S = model.args.hidden_size, position + CHUNK
    n_repeats = H_q // H
    x = mx.random.normal((1, CHUNK, E))
    q = mx.random.normal((1, H_q, CHUNK, D))
    keys = mx.random.normal((1, H, S + 64, D))[:, :, :S]  # a cache's slice
    values = mx.random.normal((1, H, S + 64, D))[:, :, :S]
    gate = mx.random.normal((1, CHUNK, model.args.intermediate_size))
    up = mx.random.normal((1, CHUNK, model.args.intermediate_size))
    scale = attention.scale
    mx.eval(x, q, keys, values, gate, up)

    # cpu_attention's blocks as it cuts them: all heads at once when the scores fit
    # one block, else each key/value head's queries in blocks.
    kernels = course.cpu_kernels
    if H_q * CHUNK * S <= kernels.SCORE_BLOCK and CHUNK <= kernels.QUERY_BLOCK:
        lead, size, count = (1, H), CHUNK, 1
    else:
        blocks = max(
            math.ceil(n_repeats * CHUNK * S / kernels.SCORE_BLOCK),
            math.ceil(CHUNK / kernels.QUERY_BLOCK),
        )
        size = math.ceil(CHUNK / blocks)
        lead, count = (1,), H * math.ceil(CHUNK / size)
    rows, seen = n_repeats * size, S - CHUNK + size  # the first block's
    q_block = mx.random.normal((*lead, D, rows))
    k_block = mx.random.normal((*lead, seen, D))
    v_block = mx.random.normal((*lead, seen, D))
    scores = k_block @ q_block
    row_max = mx.max(scores, axis=-2, keepdims=True)
    numerators = kernels.softmax_numerators(scores, row_max)
    total = mx.sum(numerators, axis=-2)[..., None]
    mx.eval(q_block, k_block, v_block, scores, row_max, numerators, total)
    hidden = S - CHUNK + 1
    tail_positions = mx.arange(hidden, seen)[:, None]
    query_positions = mx.tile(mx.arange(S - CHUNK, S - CHUNK + size), n_repeats)

    def causal_tail():  # written over the scores' last rows, in place
        return mx.where(
            tail_positions <= query_positions,
            k_block[..., hidden:, :] @ q_block,
            -mx.inf,
        )

    def times_blocks(fn):
        return lambda: [fn() for _ in range(count)]

    scores_full = mx.random.normal((1, H_q, CHUNK, S))
    mx.eval(scores_full)
    norm_weight = block.input_norm.weight
    return {
        "q, k, v, o projections": lambda: (
            attention.project_qkv(x),
            attention.project_out(q),
        ),
        "MLP matmuls (gate, up, down)": lambda: (
            x @ block.w_gate.T,
            x @ block.w_up.T,
            gate @ block.w_down.T,
        ),
        "norms, RoPE": lambda: (
            mx.fast.rms_norm(x, norm_weight, 1e-5),
            mx.fast.rms_norm(x, norm_weight, 1e-5),
            attention.apply_rope(q, position),
            attention.apply_rope(q[:, :H], position),
        ),
        "before: swiglu (mx.sigmoid)": lambda: previous_swiglu(gate, up),
        "after: swiglu (fast_exp)": lambda: course.qwen2_week2.swiglu(gate, up),
        "before: attention (mx.fast)": lambda: previous_fast_attention(
            q, keys, values, scale, "causal"
        ),
        "  of which its exps (mx.exp)": lambda: mx.exp(scores_full),
        "after: attention (cpu_attention)": lambda: course.cpu_attention(
            q, keys, values, scale, "causal"
        ),
        "  scores k @ q^T": times_blocks(lambda: k_block @ q_block),
        "  causal mask (last keys)": times_blocks(causal_tail),
        "  max over keys": times_blocks(lambda: mx.max(scores, axis=-2, keepdims=True)),
        "  exps (fast_exp)": times_blocks(
            lambda: kernels.softmax_numerators(scores, row_max)
        ),
        "  sum over keys": times_blocks(lambda: mx.sum(numerators, axis=-2)),
        "  p^T @ v, divide": times_blocks(
            lambda: (numerators.swapaxes(-1, -2) @ v_block) / total
        ),
    }


def step_ms(model, position: int, repeats: int) -> dict[str, float]:
    """The whole CHUNK-token step at `position`, before and after, interleaved."""
    cache = filled_cache(model, position)
    tokens = mx.random.randint(0, model.vocab_size, (1, CHUNK))
    runs = before_and_after(
        lambda: model(tokens, position, cache, last_position_only=True),
        lambda: rewind(cache, position),
        repeats,
    )
    return medians(runs)


def breakdown(model, positions: list[int], repeats: int, console) -> dict:
    """{position: {part: ms per step}}: the layer's parts times the layers, the
    head's one row, the measured steps and what the parts leave out."""
    layers = model.num_layers
    head_input = mx.random.normal((1, 1, model.args.hidden_size))
    mx.eval(head_input)
    results = {}
    for position in positions:
        with console.status(f"parts of a {CHUNK}-token chunk at position {position}"):
            # Alone, a part's arrays would often come from fresh memory (MLX keeps 32
            # MB of freed buffers on a CPU); within a step they are reused.
            limit = mx.set_cache_limit(PARTS_CACHE_LIMIT)
            try:
                parts = {
                    name: layers * median_ms(fn, repeats)
                    for name, fn in layer_parts(model, position).items()
                }
            finally:
                mx.set_cache_limit(limit)
            parts["LM head (the chunk's last row)"] = median_ms(
                lambda: model.logits(head_input), repeats
            )
        with console.status(f"whole steps at position {position}"):
            steps = step_ms(model, position, repeats)
        shared = (
            parts["q, k, v, o projections"]
            + parts["MLP matmuls (gate, up, down)"]
            + parts["norms, RoPE"]
            + parts["LM head (the chunk's last row)"]
        )
        for name in PATHS:
            parts[f"{name}: whole step (measured)"] = steps[name]
            explained = shared + sum(parts[part] for part in OWN_PARTS[name])
            parts[f"{name}: the rest (step - parts)"] = steps[name] - explained
        results[position] = parts
    return results


def breakdown_table(results: dict):
    positions = list(results)
    names = list(results[positions[0]])
    order = [n for n in names if not n.startswith(("before:", "after:", "  "))]
    order += [n for n in names if n.startswith("before:") and "step" not in n]
    order += [n for n in names if n.startswith("  of which")]
    order += [n for n in names if n.startswith("after:") and "step" not in n]
    order += [n for n in names if n.startswith("  ") and n not in order]
    order += [n for n in names if "step" in n and n not in order]
    rows = []
    for name in order:
        rows.append([name, *(f"{results[p][name]:.0f}" for p in positions)])
        if name.startswith("  p^T"):
            rows.append(None)
    title = (
        f"ms per {CHUNK}-token chunk step at each position (a layer's part timed "
        "alone x layers; median of --repeats)"
    )
    return grid(title, ["part", *(f"at {p}" for p in positions)], rows)


def mixed_step_goal(model, decode_rows: int, repeats: int) -> dict:
    """A mixed step at GOAL_POSITION, before and after: median ms and the ratio."""
    chunk_cache = filled_cache(model, GOAL_POSITION)
    # Rows spread over the context: 500, 1000, 1500, 2000 for four.
    decode_offsets = [
        GOAL_POSITION * (row + 1) // decode_rows for row in range(decode_rows)
    ]
    batch_cache = []
    for _ in range(model.num_layers):
        layer_cache = course.BatchingKvCache(max(decode_rows, 1), model.context_length)
        for slot, offset in enumerate(decode_offsets):
            layer_cache.add_request(random_layer_cache(model, offset), slot)
        batch_cache.append(layer_cache)
    tokens = mx.random.randint(0, model.vocab_size, (CHUNK,)).tolist()
    decode_tokens = list(range(1, decode_rows + 1))

    def step():
        chunk = course.PrefillChunk(tokens, GOAL_POSITION, chunk_cache, 1)
        batch = batch_cache if decode_rows else None
        return course.mixed_forward(
            model, decode_tokens, decode_offsets, batch, [chunk]
        )

    def reset():
        rewind(chunk_cache, GOAL_POSITION)
        for layer_cache in batch_cache:
            layer_cache.offsets[:decode_rows] = decode_offsets

    times = before_and_after(step, reset, repeats)
    ms = medians(times)
    return dict(
        decode_rows=decode_rows,
        position=GOAL_POSITION,
        ms=ms,
        runs_ms=times,
        speedup=ms["before"] / ms["after"],
    )


def tokens_check(model, tokenizer, long_tokens: int, console) -> list[dict]:
    prompts = [chat_ids(tokenizer, q) for q in SHORT_QUESTIONS[:3]]
    if long_tokens:
        prompts.append(long_prompt(tokenizer, long_tokens, seed=0))
    rows = []
    for prompt in prompts:
        with console.status(f"greedy tokens after a {len(prompt)}-token prompt"):
            results = {}
            for name, path in PATHS.items():
                with path():
                    decoder = Decoder(model, chunk=CHUNK)
                    results[name] = greedy(decoder, mx.array([prompt]), DECODE_TOKENS)
        (old, old_last), (new, new_last) = results["before"], results["after"]
        rows.append(
            {
                "prompt_tokens": len(prompt),
                "before": old,
                "after": new,
                "same": old == new,
                "max_logit_difference": mx.max(mx.abs(old_last - new_last)).item(),
            }
        )
    return rows


def main() -> int:
    bench = Bench(__doc__, repeats=(3, "timed runs of each part and step"))
    parser = bench.parser
    parser.add_argument(
        "--positions", type=int, nargs="+", default=[0, 1000, 2000, 4000, 8000]
    )
    parser.add_argument("--decode-rows", type=int, default=4)
    parser.add_argument("--long-prompt", type=int, default=2000)
    args = bench.parse()
    require_at_least(args, 0, "--positions", "--decode-rows", "--long-prompt")
    console = bench.start()
    models = bench.models()
    context = models.mlx_model.args.max_position_embeddings
    for position in [*args.positions, GOAL_POSITION, args.long_prompt]:
        if position + CHUNK + DECODE_TOKENS > context:
            fail(
                f"position {position} leaves no room for a {CHUNK}-token chunk in the "
                f"model's context of {context} positions"
            )
    model = models.float32

    results = breakdown(model, args.positions, args.repeats, console)
    console.print(breakdown_table(results))

    with console.status("the goal: mixed steps before and after"):
        goal = mixed_step_goal(model, args.decode_rows, max(args.repeats, 3))
    tokens = tokens_check(model, models.tokenizer, args.long_prompt, console)
    rows = [
        [
            str(row["prompt_tokens"]),
            "yes" if row["same"] else f"no: {row['before']} vs {row['after']}",
            f"{row['max_logit_difference']:.1e}",
        ]
        for row in tokens
    ]
    columns = ["prompt tokens", "same tokens", "max |logit diff| (prompt end)"]
    title = f"greedy tokens, before and after ({DECODE_TOKENS} a prompt)"
    console.print(grid(title, columns, rows))
    goals = [
        at_least(
            f"a mixed step with {goal['decode_rows']} decode rows and a {CHUNK}-token "
            f"chunk at position {GOAL_POSITION}: ms before / after",
            goal["speedup"],
            GOAL_SPEEDUP,
            f"before {goal['ms']['before']:.0f} ms, after {goal['ms']['after']:.0f} ms "
            f"(medians of {len(goal['runs_ms']['after'])})",
        ),
        identical(
            "greedy tokens unchanged", sum(r["same"] for r in tokens), len(tokens)
        ),
    ]
    record = dict(
        breakdown_ms={str(p): parts for p, parts in results.items()},
        goal=goal,
        tokens=tokens,
    )
    return bench.finish(record, goals)


if __name__ == "__main__":
    run_benchmark(main)
