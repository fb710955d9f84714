"""Refusing a setting whose memory could never fit, before MLX tries to allocate it
(an allocation past the machine's memory can crash the process instead of raising)."""

import os


def physical_memory() -> int:
    """This machine's memory in bytes (0 where the system does not say)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0


def kv_bytes_per_position(model) -> int | None:
    """Keys and values of one position over all the model's layers, float32 at most;
    None for a model that does not show its layers (a wrapper)."""
    layers = getattr(model, "layers", None)
    if layers is None:
        return None
    return sum(
        2 * layer.attention.num_kv_heads * layer.attention.head_dim * 4
        for layer in layers
    )


def check_fits(needed: int, what: str, advice: str) -> None:
    """ValueError, with the numbers, when `needed` bytes for `what` pass the machine's
    memory; `advice` says which setting to lower."""
    have = physical_memory()
    if have and needed > have:
        raise ValueError(
            f"{what} needs {needed / 2**30:,.1f} GiB, but this machine has "
            f"{have / 2**30:,.1f} GiB: {advice}"
        )
