"""Fast float32 matmul on Linux CPUs: put OpenBLAS under MLX before it loads.

The Linux `mlx-cpu` wheel bundles the slow reference BLAS. libmlx resolves only
`cblas_sgemm`, `cblas_dgemm` and `cblas_cgemm` from BLAS, so an OpenBLAS that exports
those names, loaded with RTLD_GLOBAL before `import mlx.core`, takes over every
float32 matmul (about 30x faster on the course's 2-core machines). macOS uses
Accelerate and needs nothing. Set `TINY_LLM_FAST_BLAS=0` to measure without it.

OpenBLAS runs its own default, a thread per core, unless OPENBLAS_NUM_THREADS (or
GOTO_NUM_THREADS, OMP_NUM_THREADS, which it also reads) names a count. Once one-row
products stopped packing (below), a thread per core was the fastest end to end on
the course's 2-core machine at batch 1 and 8 (the fast-paths appendix); before, one
thread was, and the project ran OpenBLAS on one.

This module must be imported before anything imports `mlx.core`; the package's
`__init__` does so first. A script that imports `mlx.core` earlier gets a
SlowBlasWarning saying so: OpenBLAS loaded after libmlx cannot take over, because
Python loads extension modules with RTLD_NOW and libmlx's BLAS symbols are already
bound.

Products of up to 16 rows (a decode step's projections, and a speculative step's)
go to gemv_forward.c's own kernel (gemv_kernels.h), other one-row products to
OpenBLAS's sgemv, and products just big enough for OpenBLAS to start its threads
(a short chunk's attention) to a kernel on the calling thread, since those threads
wait for a core beside the kernel's helpers. OpenBLAS 0.3.21's sgemm copies the
whole weight matrix into a packed buffer before it multiplies, even for one row,
and the kernel reads the weights once, on every core (the fast-paths chapter's
table). The file is compiled once, by the machine's C compiler, for its CPU where
it can, into ~/.cache/tiny-llm (XDG_CACHE_HOME), and loaded globally in OpenBLAS's
place; OpenBLAS is then opened locally by it. Without a compiler, or with
`TINY_LLM_GEMV_FORWARD=0`, OpenBLAS serves MLX directly.
"""

import ctypes
import ctypes.util
import hashlib
import os
import platform
import shutil
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
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
GEMV_SOURCE = Path(__file__).with_name("gemv_forward.c")
GEMV_KERNELS = GEMV_SOURCE.with_name("gemv_kernels.h")  # gemv_forward.c includes it
GEMV_VARIABLE = "TINY_LLM_GEMV_FORWARD"  # 0: few-row products through sgemm too
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
    `threads`, OpenBLAS's thread count (None without it); `gemv_forward`, the
    compiled gemv_forward.c serving MLX in front of it (None, with `gemv_hint`
    saying why not)."""

    library: str | None
    hint: str | None
    threads: int | None = None
    gemv_forward: str | None = None
    gemv_hint: str | None = None

    @property
    def active(self) -> bool:
        return self.library is not None

    @property
    def few_row_products(self) -> str:
        """Which routine a decode step's few-row products go to, and why, in a few
        words."""
        if self.gemv_forward is not None:
            return f"the few-row kernel in {self.gemv_forward}"
        return f"OpenBLAS's sgemm ({self.gemv_hint})"


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


def cache_folder() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "tiny-llm"


# Tried in order: the machine's own vector width first (a compiler that cannot
# name it, as older clangs on arm64, gets the next).
BUILD_FLAGS = (
    ("-O2", "-march=native", "-pthread"),
    ("-O2", "-pthread"),
)


def build_gemv_forward() -> tuple[Path | None, str | None]:
    """gemv_forward.c compiled into the cache (once: the hash of the source and the
    kernels it includes names the library), or (None, why not). It is built for
    this machine's CPU where the compiler can; otherwise more plainly. Concurrent
    first uses each compile to a file of their own and rename it into place."""
    source = GEMV_SOURCE.read_bytes() + GEMV_KERNELS.read_bytes()
    source += repr((BUILD_FLAGS, platform.node())).encode()
    digest = hashlib.sha256(source).hexdigest()[:12]  # built for this host's CPU
    target = cache_folder() / f"gemv_forward-{digest}-{platform.machine()}.so"
    if target.exists():
        return target, None
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None, "no C compiler (cc) to build gemv_forward.c: install gcc"
    import subprocess  # only on a first use: it is slow to import

    partial = target.with_name(f".{target.name}.{os.getpid()}")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        for flags in BUILD_FLAGS:
            command = [compiler, *flags, "-shared", "-fPIC", "-o", str(partial)]
            built = subprocess.run(
                [*command, str(GEMV_SOURCE), "-ldl"], capture_output=True, text=True
            )
            if built.returncode == 0:
                break
        else:
            said = (built.stderr.strip().splitlines() or ["no message"])[-1]
            return None, f"{compiler} could not build gemv_forward.c: {said}"
        os.replace(partial, target)
    except OSError as error:
        return None, f"could not build gemv_forward.c into {target.parent}: {error}"
    return target, None


def load_gemv_forward(openblas: str) -> tuple[str | None, str | None]:
    """The forwarder's path, loaded globally and holding OpenBLAS; or (None, why
    not)."""
    if os.environ.get(GEMV_VARIABLE) == "0":
        return None, f"few-row products through sgemm ({GEMV_VARIABLE}=0)"
    path, hint = build_gemv_forward()
    if path is None:
        return None, hint
    forwarder = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
    if forwarder.gemv_forward_init(openblas.encode()) != 0:
        return None, f"{openblas} lacks cblas_sgemv: few-row products through sgemm"
    return str(path), None


def activate() -> BlasStatus:
    """Load OpenBLAS (behind the forwarder where it builds) globally where it helps
    and can be found; never raises."""
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
    forwarder, gemv_hint = load_gemv_forward(path)
    mode = ctypes.RTLD_LOCAL if forwarder is not None else ctypes.RTLD_GLOBAL
    library = ctypes.CDLL(path, mode=mode)
    threads = (  # None: not OpenBLAS's own API
        library.openblas_get_num_threads()
        if hasattr(library, "openblas_set_num_threads")
        else None
    )
    return BlasStatus(path, None, threads, forwarder, gemv_hint)


def set_threads(count: int) -> int | None:
    """Give OpenBLAS `count` threads; returns the count it had (None without it).
    For benchmarks measuring the thread count's effect."""
    if STATUS.threads is None:
        return None
    library = ctypes.CDLL(STATUS.library)
    previous = library.openblas_get_num_threads()
    library.openblas_set_num_threads(count)
    return previous


def share_cores(processes: int) -> int | None:
    """OpenBLAS on this process's share of the cores, one of `processes` on this
    machine (tensor-parallel ranks), unless the environment names a count; returns
    the count given (None: unchanged). Two ranks of the embedded model on two threads
    each took 93 ms a decode step on the course's 2-core machine, on one each 60."""
    if processes <= 1 or any(os.environ.get(name) for name in THREAD_VARIABLES):
        return None
    threads = max(1, (os.cpu_count() or 1) // processes)
    set_threads(threads)
    return threads


@contextmanager
def openblas_alone() -> Iterator[None]:
    """Every float32 product through OpenBLAS's own sgemm inside the block, as a
    program without gemv_forward.c runs (benchmarks measure a peer this way); a
    no-op where the forwarder is not loaded. Call it between evaluations: MLX must
    not be computing meanwhile."""
    if STATUS.gemv_forward is None:
        yield
        return
    forwarder = ctypes.CDLL(STATUS.gemv_forward)
    previous = forwarder.gemv_forward_enable(0)
    try:
        yield
    finally:
        forwarder.gemv_forward_enable(previous)


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
