"""The install's first step (pdm's pre_install hook): one line, and a failed
install, on a platform the locked MLX has no wheels for, instead of pages of
resolver output. Standard library only: it runs before anything is installed.

MLX 0.32.4's wheels: macOS 14, 15 and 26 on Apple silicon (Metal), Linux on
x86-64 and arm64 (the CPU backend, or CUDA from pdm.cuda.lock). Python 3.11-3.13
is the project's requires-python, which pdm checks itself.
"""

import platform
import sys

LINUX_MACHINES = ("x86_64", "aarch64", "arm64")
OLDEST_MACOS = 14


def problem(system: str, machine: str, mac_release: str = "") -> str | None:
    """What is unsupported about this platform, or None: `system` and `machine`
    as platform.system() and platform.machine() name them, `mac_release` as
    platform.mac_ver()[0] does ("14.5")."""
    if system == "Darwin":
        if machine != "arm64":
            return (
                f"this Mac has an {machine} processor; MLX runs on Apple silicon "
                "(M1 or newer) only"
            )
        major = int(mac_release.split(".")[0]) if mac_release else 0
        if major < OLDEST_MACOS:
            return (
                f"this is macOS {mac_release or 'of an unknown version'}; MLX's "
                f"wheels need macOS {OLDEST_MACOS} or newer: update macOS first"
            )
        return None
    if system == "Linux":
        if machine not in LINUX_MACHINES:
            return f"this Linux runs on {machine}; MLX has wheels for x86-64 and arm64"
        return None
    return (
        f"this is {system}; MLX runs on macOS (Apple silicon) and Linux (use WSL 2 "
        "on Windows)"
    )


def main() -> int:
    found = problem(platform.system(), platform.machine(), platform.mac_ver()[0])
    if found is None:
        return 0
    print(f"error: tiny-llm cannot be installed here: {found}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
