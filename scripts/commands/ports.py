"""Free TCP ports for the servers and ranks the tests and benchmarks start.

A port from bind(("127.0.0.1", 0)) comes from the kernel's ephemeral range (32768
and up on Linux), the same range every outgoing connection takes its own port from:
between the check and the server's bind, a client connecting anywhere could be given
it, and the server then fails with "address in use". These ports are chosen below
that range, where only another explicit choice can take one.
"""

import random
import socket

LOWEST, HIGHEST = 20000, 32000  # below /proc/sys/net/ipv4/ip_local_port_range


def free_ports(count: int = 1, host: str = "127.0.0.1") -> int:
    """The first of `count` ports in a row on `host` that nothing holds now (a ring
    of ranks listens on starting_port + rank)."""
    for _ in range(100):
        start = random.randrange(LOWEST, HIGHEST - count)
        held = []
        try:
            for port in range(start, start + count):
                held.append(socket.socket())
                held[-1].bind((host, port))
            return start
        except OSError:
            continue
        finally:
            for sock in held:
                sock.close()
    raise RuntimeError(f"no {count} free ports in a row in {LOWEST}..{HIGHEST}")


def free_port(host: str = "127.0.0.1") -> int:
    """A port on `host` that nothing holds now."""
    return free_ports(1, host)
