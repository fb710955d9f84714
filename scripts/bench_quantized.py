"""Which weight format multiplies fastest here? Times every format on the embedded
model's layer shapes, decode-shaped (M=1) and prefill-shaped (M=128), in one run.

    python scripts/bench_quantized.py [--repeats 5] [--out results.json]

Formats, all computing x [M, K] @ w.T for a weight w [N, K]:
- float32:  the dequantized weight in float32, plain `@` (OpenBLAS on Linux CPUs)
- float16, bfloat16: the dequantized weight and x in half precision, plain `@`
- mlx q4:   mx.quantized_matmul, 4 bits, group size 32, float16 x and scales (the
            embedded model's own format)
- tiny q4:  tiny_llm_ref.quantized_matmul on the same weight with float32 x: it
            dequantizes the weight on every call, then multiplies in float32

The "all matmuls" row adds up, from the rows above, the linear layers of one decode
step (M=1) or one 128-token prefill (M=128) of the embedded model: 30 layers of q, k,
v, o, gate, up, down, and the tied 49152-row head. Attention itself is not included.
"""

import argparse
import json
import platform
import statistics
import time

import mlx.core as mx
from rich.console import Console
from rich.table import Table

import tiny_llm_ref  # first: loads the fast BLAS before mlx.core
from tiny_llm_ref.fast_blas import STATUS

GROUP_SIZE = 32
BITS = 4
NUM_LAYERS = 30
# (N, K) of each weight, and how often the embedded model uses it per token.
SHAPES = {
    "q_proj, o_proj": ((576, 576), 2 * NUM_LAYERS),
    "k_proj, v_proj": ((192, 576), 2 * NUM_LAYERS),
    "gate, up": ((1536, 576), 2 * NUM_LAYERS),
    "down": ((576, 1536), NUM_LAYERS),
    "lm_head": ((49152, 576), 1),
}
ROWS = (1, 128)
FORMATS = ("float32", "float16", "bfloat16", "mlx q4", "tiny q4")


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
    if fmt == "mlx q4":
        xs = x.astype(mx.float16)
        mx.eval(xs, packed, scales, biases)
        return lambda: mx.quantized_matmul(
            xs, packed, scales, biases, group_size=GROUP_SIZE, bits=BITS
        )
    mx.eval(x, packed, scales, biases)
    return lambda: tiny_llm_ref.quantized_matmul(
        scales, biases, GROUP_SIZE, BITS, x, packed
    )


def time_ms(fn, repeats: int, budget_s: float = 2.0) -> float:
    """Median milliseconds per call after one warm-up; fewer repeats for slow calls."""
    mx.eval(fn())
    times = []
    started = time.perf_counter()
    while len(times) < repeats and (
        len(times) < 2 or time.perf_counter() - started < budget_s
    ):
        start = time.perf_counter()
        mx.eval(fn())
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", help="also write the measurements as JSON here")
    args = parser.parse_args()

    console = Console()
    blas = (
        f"OpenBLAS ({STATUS.library})"
        if STATUS.active
        else (STATUS.hint or "platform BLAS")
    )
    console.print(
        f"mlx {mx.__version__} on {mx.default_device()}, {platform.machine()}; {blas}"
    )

    results = []
    for m in ROWS:
        for name, ((n, k), _) in SHAPES.items():
            for fmt in FORMATS:
                with console.status(f"M={m} {name} [{n}x{k}] {fmt}"):
                    ms = time_ms(matmul_for(fmt, m, n, k), args.repeats)
                results.append(
                    {"m": m, "layer": name, "n": n, "k": k, "format": fmt, "ms": ms}
                )

    table = Table(title="ms per matmul x[M, K] @ w[N, K].T (median; fastest in bold)")
    table.add_column("M", justify="right")
    table.add_column("layer")
    table.add_column("N x K", justify="right")
    for fmt in FORMATS:
        table.add_column(fmt, justify="right")
    for m in ROWS:
        totals = dict.fromkeys(FORMATS, 0.0)
        for name, ((n, k), uses) in SHAPES.items():
            row = {
                r["format"]: r["ms"]
                for r in results
                if r["m"] == m and r["layer"] == name
            }
            for fmt in FORMATS:
                totals[fmt] += uses * row[fmt]
            table.add_row(str(m), name, f"{n}x{k}", *cells(row))
        table.add_row(str(m), "all matmuls", "", *cells(totals), end_section=True)
        for fmt in FORMATS:
            results.append(
                {"m": m, "layer": "all matmuls", "format": fmt, "ms": totals[fmt]}
            )
    console.print(table)

    if args.out:
        meta = {"mlx": mx.__version__, "device": str(mx.default_device()), "blas": blas}
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "results": results}, f, indent=2)


def cells(ms_by_format: dict[str, float]) -> list[str]:
    fastest = min(ms_by_format.values())
    return [
        f"[bold]{ms_by_format[f]:.2f}[/bold]"
        if ms_by_format[f] == fastest
        else f"{ms_by_format[f]:.2f}"
        for f in FORMATS
    ]


if __name__ == "__main__":
    main()
