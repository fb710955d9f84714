"""`pdm run check-installation`: device, BLAS in use and the measured float32 matmul rate."""

import time

from scripts.commands.cli import option_parser


def matmul_gflops(n: int = 1024, repeats: int = 5) -> float:
    import mlx.core as mx

    a = mx.random.normal((n, n))
    b = mx.random.normal((n, n))
    mx.eval(a @ b)
    start = time.perf_counter()
    for _ in range(repeats):
        mx.eval(a @ b)
    return 2 * n**3 * repeats / (time.perf_counter() - start) / 1e9


def main() -> None:
    # Options first: a bad one (or --help) answers before the slow imports.
    option_parser(__doc__.splitlines()[0]).parse_args()
    import tiny_llm_base  # noqa: F401  (first: loads the fast BLAS before mlx.core)
    import mlx.core as mx

    from tiny_llm_base.fast_blas import STATUS

    print(f"mlx {mx.__version__}, default device: {mx.default_device()}")
    if STATUS.active:
        print(
            f"BLAS: OpenBLAS preloaded from {STATUS.library}, threads: "
            f"{STATUS.threads} (OPENBLAS_NUM_THREADS to change)"
        )
    elif STATUS.hint:
        print(f"BLAS: MLX's bundled reference BLAS (hint: {STATUS.hint})")
    else:
        print("BLAS: the platform's own (Accelerate on macOS, cuBLAS on CUDA)")
    print(f"float32 1024x1024 matmul: {matmul_gflops():.1f} GFLOP/s")


if __name__ == "__main__":
    main()
