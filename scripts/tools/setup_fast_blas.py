"""Install hook (`pdm install` runs it): give MLX a fast BLAS on a Linux CPU.

On Linux the mlx-cpu wheel's own BLAS is ~30x slower than OpenBLAS. Where OpenBLAS is
missing, MLX computes on the CPU (a GPU never uses this BLAS: the device switch,
tiny_llm_base.device, says which) and this user can install Debian packages (root,
or password-less sudo), it installs `libopenblas0-pthread`; otherwise it prints one
hint and carries on. With OpenBLAS there, it builds fast_blas's few-row forwarder
(gemv_forward.c) at install rather than at the first import, or says why it cannot.
"""

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path


def load(name: str):
    """src/tiny_llm_base/<name>.py alone, without the package (which imports mlx
    first thing and everything else after)."""
    spec = importlib.util.spec_from_file_location(
        name, Path(__file__).parents[2] / f"src/tiny_llm_base/{name}.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


fast_blas = load("fast_blas")  # first: before anything imports mlx.core
device = load("device")


def apt_command() -> list[str] | None:
    if shutil.which("apt-get") is None:
        return None
    if os.geteuid() == 0:
        return []
    sudo_ok = (
        shutil.which("sudo")
        and subprocess.run(["sudo", "-n", "true"], capture_output=True).returncode == 0
    )
    return ["sudo", "-n"] if sudo_ok else None


def main() -> int:
    if not fast_blas.needs_openblas():
        return 0
    if fast_blas.find_openblas():  # loading fast_blas above built the forwarder
        status = fast_blas.STATUS
        if status.gemv_hint and os.environ.get(fast_blas.GEMV_VARIABLE) != "0":
            print(f"tiny-llm: hint: {status.gemv_hint}", file=sys.stderr)
        return 0
    if device.gpu_paths():
        return 0
    prefix = apt_command()
    if prefix is None:
        print(f"tiny-llm: hint: {fast_blas.activate().hint}", file=sys.stderr)
        return 0
    print(f"tiny-llm: installing {fast_blas.DEBIAN_PACKAGE} for fast float32 matmul")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for args in (
        ["apt-get", "update", "-qq"],
        ["apt-get", "install", "-y", "-qq", fast_blas.DEBIAN_PACKAGE],
    ):
        if subprocess.run(prefix + args, env=env).returncode != 0:
            print(
                f"tiny-llm: hint: could not install {fast_blas.DEBIAN_PACKAGE}; "
                "MLX will run with its slow reference BLAS",
                file=sys.stderr,
            )
            return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
