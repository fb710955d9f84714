"""Fast float32 matmul on Linux CPUs: put OpenBLAS under MLX before it loads.

The Linux `mlx-cpu` wheel bundles the slow reference BLAS. libmlx resolves only
`cblas_sgemm`, `cblas_dgemm` and `cblas_cgemm` from BLAS, so an OpenBLAS that exports
those names, loaded with RTLD_GLOBAL before `import mlx.core`, takes over every
float32 matmul (about 30x faster on the course's 2-core machines). macOS uses
Accelerate and needs nothing. Set `TINY_LLM_FAST_BLAS=0` to measure without it.

OpenBLAS runs one thread here unless OPENBLAS_NUM_THREADS (or GOTO_NUM_THREADS,
OMP_NUM_THREADS, which it also reads) says otherwise. Its default, a thread per
core, splits every product of 2 or more rows across the cores, and a decode step is
about 210 such small products: on the course's 2-core machine a step of 4 rows
cost what 1 row does at 1 thread and far more at 2 (the fast-paths chapter, week 2
day 3). One row alone and a prefill's many rows do run faster on more threads: set
OPENBLAS_NUM_THREADS where those matter more than batched decoding.

This module must be imported before anything imports `mlx.core`; the package's
`__init__` does so first. A script that imports `mlx.core` earlier gets a
SlowBlasWarning saying so: OpenBLAS loaded after libmlx cannot take over, because
Python loads extension modules with RTLD_NOW and libmlx's BLAS symbols are already
bound.
"""

import ctypes
import ctypes.util
import os
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

SYSTEM_OPENBLAS = [
    "/usr/lib/x86_64-linux-gnu/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/libopenblas.so.0",
    "/usr/lib64/libopenblasp.so.0",
    "/usr/lib64/libopenblas.so.0",
    "/usr/lib/libopenblas.so.0",
]
DEBIAN_PACKAGE = "libopenblas0-pthread"
THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")
IMPORTED_TOO_LATE = (
    "mlx.core was imported before tiny_llm, so float32 matmul runs on MLX's slow "
    "reference BLAS (~30x slower): import tiny_llm (or tiny_llm_ref, tiny_llm_base) "
    "before mlx"
)


class SlowBlasWarning(RuntimeWarning):
    """Float32 matmul will run on MLX's bundled reference BLAS on a Linux CPU."""


@dataclass(frozen=True)
class BlasStatus:
    """What `activate()` found: `library` is the loaded path, or None with a `hint`;
    `threads`, OpenBLAS's thread count (None without it)."""

    library: str | None
    hint: str | None
    threads: int | None = None

    @property
    def active(self) -> bool:
        return self.library is not None


def needs_openblas() -> bool:
    return sys.platform.startswith("linux")


def find_openblas() -> str | None:
    """The first OpenBLAS on this machine that exports plain `cblas_sgemm`."""
    candidates = [p for p in SYSTEM_OPENBLAS if Path(p).exists()]
    found = ctypes.util.find_library("openblas")
    if found:
        candidates.append(found)
    for path in candidates:
        try:
            library = ctypes.CDLL(path)
        except OSError:
            continue
        if hasattr(library, "cblas_sgemm"):
            return path
    return None


def activate() -> BlasStatus:
    """Load OpenBLAS globally where it helps and can be found; never raises."""
    if not needs_openblas():
        return BlasStatus(None, None)
    if os.environ.get("TINY_LLM_FAST_BLAS") == "0":
        return BlasStatus(None, "fast BLAS disabled by TINY_LLM_FAST_BLAS=0")
    if "mlx.core" in sys.modules:
        return BlasStatus(None, IMPORTED_TOO_LATE)
    path = find_openblas()
    if path is None:
        return BlasStatus(
            None,
            f"float32 matmul uses MLX's slow reference BLAS; install OpenBLAS "
            f"(`sudo apt-get install {DEBIAN_PACKAGE}` on Debian/Ubuntu) for ~30x faster math",
        )
    library = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    if not hasattr(library, "openblas_set_num_threads"):  # not OpenBLAS's own API
        return BlasStatus(path, None)
    if not any(os.environ.get(name) for name in THREAD_VARIABLES):
        library.openblas_set_num_threads(1)
    return BlasStatus(path, None, library.openblas_get_num_threads())


def set_threads(count: int) -> int | None:
    """Give OpenBLAS `count` threads; returns the count it had (None without it).
    For benchmarks measuring the thread count's effect."""
    if STATUS.threads is None:
        return None
    library = ctypes.CDLL(STATUS.library)
    previous = library.openblas_get_num_threads()
    library.openblas_set_num_threads(count)
    return previous


def importer_stacklevel() -> int:
    """warnings.warn's stacklevel for the first caller outside tiny-llm's packages:
    the line that imported them. Like warnings, it skips importlib's own frames."""
    packages = str(Path(__file__).resolve().parents[1])
    level, frame = 1, sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        if not ("importlib" in name and "_bootstrap" in name):
            if not name.startswith(packages):
                return level
            level += 1
        frame = frame.f_back
    return level


STATUS = activate()
if STATUS.hint == IMPORTED_TOO_LATE:
    # Imported here, not at the top: the install hook (setup_fast_blas.py) loads
    # this file alone, outside its package, and never gets this far.
    from .device import gpu_paths

    if not gpu_paths():
        warnings.warn(
            IMPORTED_TOO_LATE, SlowBlasWarning, stacklevel=importer_stacklevel()
        )
