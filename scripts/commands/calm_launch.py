"""mlx.launch as bench-tensor-parallel and the week 4 tests run it: MLX's own
launcher (mlx._distributed_utils.launch.main) with one change, to its select: it
never waits to write the ranks' stdin nor to read its own. Those pipes are always
ready, so with them in its lists select returns at once and the launcher's threads
spin: in a 2-rank launch of tests/tensor_parallel_worker.py the launcher took more
CPU than either rank (6.6 CPU-seconds against 3.6 each), on the cores the ranks
need. Everything else, the ranks' start, their output and how a rank's exit stops
the others, is the launcher's own code. The ranks get no input from the terminal.

    python scripts/commands/calm_launch.py [mlx.launch's arguments]
"""

import select
import sys

from mlx._distributed_utils import launch


def calm_select(read: list, write: list, error: list, timeout: float):
    """select without the launcher's stdin and the ranks' stdin pipes."""
    read = [fd for fd in read if fd != sys.stdin.fileno()]
    ready, _, failed = select.select(read, [], error, timeout)
    return ready, [], failed


def launcher() -> list[str]:
    """The command that starts this launcher; mlx.launch's arguments follow."""
    return [sys.executable, __file__]


if __name__ == "__main__":
    launch.select = calm_select
    sys.exit(launch.main())
