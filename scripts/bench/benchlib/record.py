"""A benchmark's JSON record (--out): checked before the run, the machine it ran
on, written whole or not at all.

    path = out_path("bench-results/x.json")   # --out's type: empty is refused
    problem = unwritable(path)                 # why it cannot be written, or None
    write_json(path, record)                   # beside it, then renamed over it

A run writes its record at the end, and one with parts (bench-speed, bench-paged,
bench-chunked-prefill) also as each part finishes (Bench.keep): a partial record
that the end's replaces. A run stopped by Ctrl-C or a failure leaves the last one
written, never a file cut short.
"""

import argparse
import dataclasses
import json
import os
import platform
from pathlib import Path


def out_path(text: str) -> Path:
    """An output file's option (--out) as a Path; argparse's error (one line) for
    an empty one, which Path would read as the current folder."""
    if not text.strip():
        raise argparse.ArgumentTypeError("is empty: give the path of a file to write")
    return Path(text)


def writing(path: Path) -> Path:
    """The file a record for `path` is written to before it is renamed over it."""
    return path.with_name(f".{path.name}.writing")


def unwritable(path: Path, example: str = "record.json") -> str | None:
    """Why no record can be written at `path`, and what to do (None: it can),
    found by making its folder and writing, then removing, the file write_json
    writes first. example: a file name to suggest when `path` is a folder."""
    try:
        if path.is_dir():
            return f"{path} is a folder: give a file in it, e.g. {path / example}"
        path.parent.mkdir(parents=True, exist_ok=True)
        writing(path).write_text("")
        writing(path).unlink()
    except OSError as error:
        made = os.path.isdir(path.parent)  # False, not an error, for a bad path
        what = "it cannot be written" if made else "its folder cannot be made"
        return f"{path}: {what} ({error.strerror}); give a path you can write"
    return None


def machine() -> dict:
    """The CPU, its cores, MLX and its device, the BLAS and the load average now."""
    import mlx.core as mx

    from tiny_llm_base.fast_blas import STATUS

    cpu = platform.processor() or platform.machine()
    if Path("/proc/cpuinfo").exists():
        names = [
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ]
        cpu = names[0] if names else cpu
    return dict(
        cpu=cpu,
        machine=platform.machine(),
        cores=os.cpu_count(),
        mlx=mx.__version__,
        device=str(mx.default_device()),
        blas=f"OpenBLAS ({STATUS.library}, threads: {STATUS.threads}; few-row "
        f"products: {STATUS.few_row_products})"
        if STATUS.active
        else (STATUS.hint or "platform BLAS"),
        load_average=dict(before=os.getloadavg()),
    )


def without(value, key: str | None):
    """value with `key` left out of every dict within it."""
    if isinstance(value, dict):
        return {k: without(v, key) for k, v in value.items() if k != key}
    if isinstance(value, list):
        return [without(v, key) for v in value]
    return value


def to_json(value):
    """json.dumps' default: a record() method, a dataclass, else its text."""
    if hasattr(value, "record"):
        return value.record()
    if dataclasses.is_dataclass(value):
        return dataclasses.asdict(value)
    return str(value)


def write_json(path: Path, record: dict) -> None:
    """The record at `path`, whole: an interrupted write leaves the file it found."""
    path.parent.mkdir(parents=True, exist_ok=True)
    writing(path).write_text(json.dumps(record, indent=2, default=to_json) + "\n")
    os.replace(writing(path), path)
