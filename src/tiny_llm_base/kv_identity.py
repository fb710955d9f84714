"""What a block file of the disk tier (kv_disk.py) must match besides its tokens:
the model's identity, which names the folder its blocks live in, and the layout in
which the pool stores a block's keys and values, which every file read is checked
against."""

import hashlib
from collections.abc import Iterator

import mlx.core as mx

from .memory import kv_row_bytes

FORMAT = "tiny-llm-kv-block/2"  # in the identity: another format, another folder
SAMPLE = 4096  # values of each array that the identity reads


def model_identity(model, block_size: int, kv_dtype: str = "float32") -> str:
    """A hex digest of what a block's keys and values depend on besides its tokens:
    the block size, how the pool stores them (kv_dtype), and everything reachable
    from the model's attributes (its class and settings; every array's path, shape
    and dtype, and SAMPLE of its values, evenly spread, so that weights of the same
    shapes but other values differ)."""
    digest = hashlib.sha256(
        f"{FORMAT} block_size={block_size} kv_dtype={kv_dtype}".encode()
    )
    for path, value in model_state(model, type(model).__name__):
        if isinstance(value, mx.array):
            flat = value.reshape(-1)
            sample = flat[:: max(1, flat.size // SAMPLE)][:SAMPLE]
            digest.update(f"{path} {value.shape} {value.dtype}".encode())
            digest.update(memoryview(mx.contiguous(sample)))
        else:
            digest.update(f"{path}={value}".encode())
    return digest.hexdigest()


def model_state(value, path: str, seen: set[int] | None = None) -> Iterator:
    """(path, leaf) for every array and plain value reachable from `value` through
    attributes (but those named _like_this), lists, tuples and dicts, in their
    order; any other object counts by its type's name (a repr may hold an address
    that changes every run)."""
    seen = set() if seen is None else seen
    if isinstance(value, (mx.array, str, bytes, int, float, bool, type(None))):
        yield path, value
        return
    if isinstance(value, mx.Dtype):
        yield path, str(value)
        return
    if id(value) in seen:
        return
    seen.add(id(value))
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, (list, tuple)):
        items = enumerate(value)
    elif hasattr(value, "__dict__"):
        # A leading underscore marks what a step leaves behind (FastRope's rows),
        # not what the model is.
        items = [(k, v) for k, v in vars(value).items() if not k.startswith("_")]
    else:
        items = ()
    yield path, type(value).__name__
    for key, item in items:
        yield from model_state(item, f"{path}.{key}", seen)


def block_layout(model, block_size: int, kv_dtype: str) -> tuple[tuple, mx.Dtype]:
    """The shape [layers, H, block_size, W] and dtype of a block's keys (and values)
    as the pool stores them: W is the head size D, at the model's own dtype (its
    embedding's) or float16, or a quantized row's uint32 words."""
    layers = getattr(model, "layers", None)
    if not layers:
        raise ValueError(
            "the disk tier checks every block against the model's layers, and this "
            "model does not show them: leave kv_disk_dir out"
        )
    attention = layers[0].attention
    dtype = {"float32": model.embedding.weight.dtype, "float16": mx.float16}.get(
        kv_dtype, mx.uint32
    )
    width = kv_row_bytes(attention.head_dim, dtype.size, kv_dtype) // dtype.size
    return (len(layers), attention.num_kv_heads, block_size, width), dtype
