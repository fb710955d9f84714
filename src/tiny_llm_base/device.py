"""The one device switch: every branch that differs between a CPU and a GPU asks
gpu_paths(), and nothing else asks MLX which device it runs on.

The branches (the fast-paths chapter, week 2 day 3): on a CPU weights are float32
and stored for the BLAS, swiglu and attention use this course's own kernels, and a
float16 KV pool reads back through a bit trick; on a GPU (Metal or CUDA) weights
stay quantized and MLX's fused kernels and casts run. `TINY_LLM_DEVICE_PATHS=gpu`
takes the GPU's side of every branch on any device, so a CPU-only machine runs and
tests that side too (slowly: it is the GPU's code, on a CPU); `cpu` takes the CPU's.

It imports mlx.core only to ask MLX: the install hook (scripts/tools/setup_fast_blas.py)
loads this file alone and must not fail where mlx cannot load.
"""

import os

PATHS_VARIABLE = "TINY_LLM_DEVICE_PATHS"
PATHS = ("cpu", "gpu")


def gpu_paths() -> bool:
    """Whether the device branches take their GPU side: TINY_LLM_DEVICE_PATHS when
    it is set, else whether MLX's default device is a GPU. ValueError naming the
    allowed values for any other setting."""
    forced = os.environ.get(PATHS_VARIABLE)
    if forced is None:
        import mlx.core as mx

        return mx.default_device().type == mx.gpu
    if forced not in PATHS:
        raise ValueError(
            f"{PATHS_VARIABLE} is {forced!r}: set it to 'cpu' or 'gpu', or unset "
            "it to follow MLX's default device"
        )
    return forced == "gpu"
