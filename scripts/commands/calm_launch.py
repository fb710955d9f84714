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

import random
import select
import socket
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


def free_starting_port(ranks: int, host: str = "127.0.0.1") -> int:
    """A --starting-port for a ring of `ranks` on `host`: each rank listens on its
    own port, starting_port + rank, so all of them must be free. Chosen below the
    kernel's ephemeral range (32768 and up on Linux), where no bind to port 0 and
    no outgoing connection is given a port: only another explicit choice can take
    one of them between this check and the ranks' binds."""
    for _ in range(100):
        start = random.randrange(20000, 32000 - ranks)
        held = []
        try:
            for port in range(start, start + ranks):
                held.append(socket.socket())
                held[-1].bind((host, port))
            return start
        except OSError:
            continue
        finally:
            for sock in held:
                sock.close()
    raise RuntimeError(f"no {ranks} free ports in a row in 20000..32000 on {host}")


if __name__ == "__main__":
    launch.select = calm_select
    sys.exit(launch.main())
