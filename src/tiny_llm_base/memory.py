"""Refusing a setting whose memory could never fit, before MLX tries to allocate it
(an allocation past the machine's memory can crash the process instead of raising).

The memory that counts is the device's: on the GPU's side of the device switch
(device.gpu_paths), the GPU's as MLX reports it (mx.device_info()); on a CPU, the
machine's RAM."""

import os
import re

import mlx.core as mx

from .device import gpu_paths

# mx.device_info()'s keys: Metal's working set (the most the GPU should keep
# resident, below the Mac's RAM), a CUDA device's total and free memory.
METAL_WORKING_SET = "max_recommended_working_set_size"
CUDA_TOTAL, CUDA_FREE = "total_memory", "free_memory"


def physical_memory() -> int:
    """This machine's memory in bytes (0 where the system does not say)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0


def available_memory() -> int:
    """Memory the system could give this process now, in bytes: Linux's
    MemAvailable, else the free pages, else the physical memory (0 where the system
    does not say)."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return physical_memory()


def gpu_info() -> dict:
    """mx.device_info() on the GPU's side of the device switch, else {}."""
    return mx.device_info() if gpu_paths() else {}


def device_memory() -> int:
    """The memory of the device MLX computes on, in bytes: a GPU's as MLX reports
    it (Metal's working set, a CUDA device's total memory); on a CPU, and on a CPU
    taking the GPU's side, where MLX reports neither, physical_memory()."""
    info = gpu_info()
    for key in (METAL_WORKING_SET, CUDA_TOTAL):
        if key in info:
            return int(info[key])
    return physical_memory()


def device_available_memory() -> int:
    """The memory the device could give this process now, in bytes: Metal's working
    set less what MLX holds already (the weights among it), a CUDA device's free
    memory; on a CPU, available_memory()."""
    info = gpu_info()
    if METAL_WORKING_SET in info:
        return max(0, int(info[METAL_WORKING_SET]) - mx.get_active_memory())
    if CUDA_FREE in info:
        return int(info[CUDA_FREE])
    return available_memory()


# How the paged pool may store keys and values (EngineConfig.kv_dtype): "float32"
# as the model computes them, "float16", or quantized to KV_BITS bits in groups of
# KV_GROUP_SIZE numbers, each group with a float32 scale and bias.
KV_DTYPES = ("float32", "float16", "int8", "int4")
KV_BITS = {"int8": 8, "int4": 4}
KV_GROUP_SIZE = 32


def kv_row_bytes(head_dim: int, element_size: int, kv_dtype: str = "float32") -> int:
    """Bytes of one head's key (or value) at one position: head_dim numbers of
    element_size bytes (2 in float16), or, quantized, head_dim * bits / 8 bytes and a
    float32 scale and bias for each group of KV_GROUP_SIZE numbers."""
    if kv_dtype == "float32":
        return head_dim * element_size
    if kv_dtype == "float16":
        return head_dim * 2
    bits = KV_BITS[kv_dtype]
    return head_dim * bits // 8 + 2 * 4 * (head_dim // KV_GROUP_SIZE)


def kv_bytes_per_position(
    model, element_size: int = 4, kv_dtype: str = "float32"
) -> int | None:
    """Keys and values of one position over all the model's layers, at
    `element_size` bytes a number (default 4: float32, the most a model here keeps)
    or quantized as kv_dtype says; None for a model that does not show its layers
    (a wrapper)."""
    layers = getattr(model, "layers", None)
    if layers is None:
        return None
    return sum(
        2
        * layer.attention.num_kv_heads
        * kv_row_bytes(layer.attention.head_dim, element_size, kv_dtype)
        for layer in layers
    )


def kv_bytes_per_token(model, kv_dtype: str = "float32") -> int | None:
    """Keys and values of one token over all layers at the model's own dtype (its
    activations', kv_element_size), or quantized as kv_dtype says; None for a model
    that hides its layers."""
    return kv_bytes_per_position(model, kv_element_size(model), kv_dtype)


def tokens_by_dtype(model, budget: int, block_size: int) -> dict[str, int]:
    """The tokens `budget` bytes of KV blocks hold at each of KV_DTYPES: whole
    blocks of block_size tokens ({} for a model that hides its layers)."""
    fits = {}
    for kv_dtype in KV_DTYPES:
        per_token = kv_bytes_per_token(model, kv_dtype)
        if per_token is None:
            return {}
        fits[kv_dtype] = budget // (per_token * block_size) * block_size
    return fits


def kv_element_size(model) -> int:
    """Bytes of one cached number: the size of the model's activation dtype (its
    embedding table's), 4 when the model does not show it."""
    weight = getattr(getattr(model, "embedding", None), "weight", None)
    dtype = getattr(weight, "dtype", None)
    return dtype.size if dtype is not None else 4


UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def parse_bytes(name: str, value) -> int:
    """A size in bytes from an int or a string such as "512MiB", "1.5GB" or
    "4096"; TypeError or ValueError naming the setting otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise TypeError(
            f"{name} must be bytes as an int or a size such as '512MiB', got "
            f"{type(value).__name__}"
        )
    if isinstance(value, int):
        size = value
    else:
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", value)
        unit = match and match.group(2).lower()
        if not match or unit not in UNITS:
            raise ValueError(
                f"{name} must be a size such as '512MiB', '2GiB' or '1.5GB', got "
                f"{value!r}"
            )
        size = int(float(match.group(1)) * UNITS[unit])
    if size < 1:
        raise ValueError(f"{name} must be at least 1 byte, got {value!r}")
    return size


def format_bytes(size: int) -> str:
    """`size` bytes in the largest binary unit that keeps it at least 1."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            return f"{size / scale:,.1f} {unit}"
    return f"{size} B"


def check_fits(needed: int, what: str, advice: str) -> None:
    """ValueError, with the numbers, when `needed` bytes for `what` pass the device's
    memory (device_memory); `advice` says which setting to lower."""
    have = device_memory()
    if have and needed > have:
        raise ValueError(
            f"{what} needs {needed / 2**30:,.1f} GiB, but this device has "
            f"{have / 2**30:,.1f} GiB: {advice}"
        )
