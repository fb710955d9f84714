"""`pdm run check-installation`: device, BLAS in use and the measured float32 matmul rate.

Also the MLX backend and the side of the device switch, and one token of the
embedded model as the engine runs it here, beside mlx-lm's."""

import time

from scripts.commands.cli import option_parser

SMOKE_PROMPT = "The capital of France is"


def matmul_gflops(n: int = 1024, repeats: int = 5) -> float:
    import mlx.core as mx

    a = mx.random.normal((n, n))
    b = mx.random.normal((n, n))
    mx.eval(a @ b)
    start = time.perf_counter()
    for _ in range(repeats):
        mx.eval(a @ b)
    return 2 * n**3 * repeats / (time.perf_counter() - start) / 1e9


def backend_and_device() -> str:
    """The MLX backend this install has, the device it computes on, and the side of
    the device switch (tiny_llm_base.device) the course's branches take."""
    import mlx.core as mx

    from tiny_llm_base.device import gpu_paths

    if mx.metal.is_available():
        backend = "Metal"
    elif mx.cuda.is_available():
        backend = "CUDA"
    else:
        backend = "CPU only"
    name = mx.device_info().get("device_name", "unnamed")
    side = "GPU's" if gpu_paths() else "CPU's"
    return (
        f"backend: {backend}; computing on {mx.default_device()} ({name}); device "
        f"branches: the {side} side"
    )


def smoke_test() -> str:
    """One greedy token of the embedded model after SMOKE_PROMPT, run as the engine
    runs it on this device (weights="auto", fast kernels), beside mlx-lm's own."""
    import mlx.core as mx
    import tiny_llm_ref

    from tiny_llm_base import load_model

    mlx_model, tokenizer = load_model()
    ids = mx.array(tokenizer.encode(SMOKE_PROMPT))[None]
    model = tiny_llm_ref.Qwen2ModelWeek2(
        mlx_model, weights="auto", use_fast_kernels=True
    )
    start = time.perf_counter()
    ours = mx.argmax(model(ids, 0, model.create_kv_cache())[0, -1]).item()
    seconds = time.perf_counter() - start
    theirs = mx.argmax(mlx_model(ids)[0, -1]).item()
    verdict = (
        "mlx-lm's too"
        if ours == theirs
        else f"but mlx-lm's is {tokenizer.decode([theirs])!r}: please report this"
    )
    return (
        f"one token: {SMOKE_PROMPT!r} -> {tokenizer.decode([ours])!r} in "
        f"{seconds:.2f} s, {verdict}"
    )


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
        print(f"few-row products: {STATUS.few_row_products}")
    elif STATUS.hint:
        print(f"BLAS: MLX's bundled reference BLAS (hint: {STATUS.hint})")
    else:
        print("BLAS: the platform's own (Accelerate on macOS, cuBLAS on CUDA)")
    print(f"float32 1024x1024 matmul: {matmul_gflops():.1f} GFLOP/s")
    print(backend_and_device())
    print(smoke_test())


if __name__ == "__main__":
    main()
