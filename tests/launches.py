"""mlx.launch on local ranks, as the week 4 tests start them: the ring backend on
127.0.0.1 from a free port, each launch in a session of its own so that no rank
outlives it. The launcher is MLX's own, run by scripts/commands/calm_launch.py so
that it does not spin a core beside the ranks."""

import os
import signal
import sys
import time

import pytest

from scripts.commands.calm_launch import launcher
from scripts.commands.ports import free_ports

# Seconds a launch may take before it and its ranks are killed: a bound for a
# launch that hangs, never a speed goal (a 2-rank launch took ~10 s quiet and ~2 min
# at a load of 20 on a 2-core machine).
LAUNCH_TIMEOUT = 600


def launch_command(
    ranks: int, *command: str, starting_port: int | None = None
) -> list[str]:
    """mlx.launch running `command` (a script and its arguments) on `ranks` local
    ranks: ring backend, 127.0.0.1, a starting port with `ranks` free ports from it
    (the ranks' ports; one in use made rank 1 exit at its bind)."""
    if starting_port is None:
        starting_port = free_ports(ranks)
    return [
        *launcher(),
        "--hosts", "127.0.0.1",
        "-n", str(ranks),
        "--backend", "ring",
        "--starting-port", str(starting_port),
        "--python", sys.executable,
        *command,
    ]  # fmt: skip


def assert_no_rank_left(session: int) -> None:
    """Every process of the launcher's session has exited (killed after 5 s)."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.killpg(session, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.killpg(session, signal.SIGKILL)
    pytest.fail("a rank outlived its launcher (killed now)")
