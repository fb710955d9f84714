"""Which weight format multiplies fastest here? Times every format on the embedded
model's layer shapes, decode-shaped (M=1) and prefill-shaped (M=128), in one run.

    python -m scripts.bench.bench_quantized [--repeats 5] [--out results.json]

Formats, all computing x [M, K] @ w.T for a weight w [N, K]:
- float32:  the dequantized weight in float32, plain `@` (OpenBLAS on Linux CPUs)
- float16, bfloat16: the dequantized weight and x in half precision, plain `@`
- mlx q4:   mx.quantized_matmul, 4 bits, group size 32, float16 scales and biases
            (the embedded model's storage) with float32 x
- mlx q4 f16: the same with float16 x, the all-half-precision path; its CPU cost
            grows with M so steeply that it is timed at M=1 only
- tiny q4:  the course's quantized_matmul on the same weight with float32 x: it
            dequantizes the weight to float32 on every call, then uses `@`

The "all matmuls" row adds up, from the rows above, the linear layers of one decode
step (M=1) or one 128-token prefill (M=128) of the embedded model: 30 layers of q, k,
v, o, gate, up, down, and the tied 49152-row head. Attention itself is not included.
Goal: at each M, the format choose_weight_format picks for this device is the
fastest in that row (exit status 1 when another is).
"""

from scripts.commands.interrupt import exit_on_interrupt

exit_on_interrupt()  # first: Ctrl-C during the imports below never shows a traceback

import tiny_llm_base  # noqa: F401  (first: loads the fast BLAS before mlx.core)

# isort: split
import mlx.core as mx

from scripts.bench.benchlib.course import course, run_benchmark
from scripts.bench.benchlib.harness import Bench, timed
from scripts.bench.benchlib.goals import at_most
from scripts.bench.benchlib.render import grid
from tiny_llm_base import choose_weight_format

GROUP_SIZE = 32
BITS = 4
NUM_LAYERS = 30
# (N, K) of each weight, and how often the embedded model uses it per token.
SHAPES = {
    "q, o": ((576, 576), 2 * NUM_LAYERS),
    "k, v": ((192, 576), 2 * NUM_LAYERS),
    "gate, up": ((1536, 576), 2 * NUM_LAYERS),
    "down": ((576, 1536), NUM_LAYERS),
    "lm_head": ((49152, 576), 1),
}
ROWS = (1, 128)
FORMATS = ("float32", "float16", "bfloat16", "mlx q4", "mlx q4 f16", "tiny q4")
DECODE_ONLY = {"mlx q4 f16"}


def matmul_for(fmt: str, m: int, n: int, k: int):
    """A zero-argument function computing one [m, k] @ [n, k].T in format `fmt`."""
    weight = mx.random.normal((n, k)) * 0.02
    x = mx.random.normal((m, k))
    packed, scales, biases = mx.quantize(
        weight.astype(mx.float16), group_size=GROUP_SIZE, bits=BITS
    )
    if fmt in ("float32", "float16", "bfloat16"):
        dtype = getattr(mx, fmt)
        w, xs = weight.astype(dtype), x.astype(dtype)
        mx.eval(w, xs)
        return lambda: xs @ w.T
    if fmt in ("mlx q4", "mlx q4 f16"):
        xs = x.astype(mx.float16) if fmt == "mlx q4 f16" else x
        mx.eval(xs, packed, scales, biases)
        return lambda: mx.quantized_matmul(
            xs, packed, scales, biases, group_size=GROUP_SIZE, bits=BITS
        )
    mx.eval(x, packed, scales, biases)
    return lambda: course.quantized_matmul(scales, biases, GROUP_SIZE, BITS, x, packed)


def time_ms(fn, repeats: int) -> float:
    """Best milliseconds per call after one warm-up (the least disturbed by other
    work on the machine); fewer repeats for slow calls (2 s of timing)."""
    return 1e3 * min(timed(fn, repeats, budget_s=2.0))


def measure(repeats: int, console) -> dict[tuple[int, str, str], float]:
    """{(M, layer, format): ms} for every shape and format (decode-only ones at M=1)."""
    ms = {}
    for m in ROWS:
        for layer, ((n, k), _) in SHAPES.items():
            for fmt in FORMATS:
                if m > 1 and fmt in DECODE_ONLY:
                    continue
                with console.status(f"M={m} {layer} [{n}x{k}] {fmt}"):
                    ms[m, layer, fmt] = time_ms(matmul_for(fmt, m, n, k), repeats)
        for fmt in FORMATS:
            if (m, "q, o", fmt) in ms:
                ms[m, "all matmuls", fmt] = sum(
                    uses * ms[m, layer, fmt] for layer, (_, uses) in SHAPES.items()
                )
    return ms


def render(ms: dict[tuple[int, str, str], float]):
    rows = []
    for m in ROWS:
        for layer in (*SHAPES, "all matmuls"):
            row = {fmt: ms[m, layer, fmt] for fmt in FORMATS if (m, layer, fmt) in ms}
            cells = [cell(row.get(fmt), min(row.values())) for fmt in FORMATS]
            size = "{}x{}".format(*SHAPES[layer][0]) if layer in SHAPES else ""
            rows.append([str(m), layer, size, *cells])
        rows.append(None)
    title = "ms per matmul x[M, K] @ w[N, K].T (best of --repeats; fastest in bold)"
    return grid(title, ["M", "layer", "N x K", *FORMATS], rows[:-1])


def cell(ms: float | None, fastest: float) -> str:
    if ms is None:
        return "-"
    return f"[bold]{ms:.2f}[/bold]" if ms == fastest else f"{ms:.2f}"


def policy_goals(ms: dict[tuple[int, str, str], float]) -> list:
    """At each M, the format choose_weight_format picks here ("float32", or mlx q4
    for "quantized") against the fastest other format, all matmuls: at most 1, so
    the policy is what this table measures."""
    chosen = "float32" if choose_weight_format() == "float32" else "mlx q4"
    goals = []
    for m in ROWS:
        total = {
            f: ms[m, "all matmuls", f] for f in FORMATS if (m, "all matmuls", f) in ms
        }
        rival = min((f for f in total if f != chosen), key=total.get)
        why = f"{chosen} {total[chosen]:.1f} ms, {rival} {total[rival]:.1f} ms"
        name = (
            f"M={m}: all matmuls, {chosen} (choose_weight_format) / the fastest other"
        )
        goals.append(at_most(name, total[chosen] / total[rival], 1.0, why))
    return goals


def main() -> int:
    bench = Bench(__doc__, repeats=(5, "timed calls of each matmul, the best kept"))
    args = bench.parse()
    console = bench.start()
    ms = measure(args.repeats, console)
    console.print(render(ms))
    results = [
        {"m": m, "layer": layer, "format": fmt, "ms": value}
        for (m, layer, fmt), value in ms.items()
    ]
    return bench.finish(dict(results=results), policy_goals(ms))


if __name__ == "__main__":
    run_benchmark(main)
