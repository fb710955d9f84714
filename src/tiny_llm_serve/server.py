"""Running the app: a socket bound before the slow start, and a clean stop.

`listen_socket` binds the address before uvicorn starts, so that a port in use is
an OSError the caller can report in one line (uvicorn logs and exits on its own).
`serve` runs uvicorn on that socket and calls on_started once requests are
answered. A stop signal (SIGTERM, Ctrl-C) first
ends every open request with a 503, streams with an error event and [DONE], so no
client sees its answer cut off without a word; uvicorn then closes the connections.
"""

import contextlib
import signal
import socket
import threading
from collections.abc import Callable, Generator
from types import FrameType

import h11
import uvicorn
from fastapi import FastAPI
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import HANDLED_SIGNALS

GRACE_S = 5  # open connections get this long to finish after a stop signal
HEADER_TIMEOUT_S = 10.0  # a request's headers must all arrive within this


class H11WithHeaderTimeout(H11Protocol):
    """uvicorn's h11 protocol, closing a connection whose request headers are not
    all there HEADER_TIMEOUT_S after it opened (or after its last response): one
    header sent a byte at a time would otherwise hold a connection for good
    (slowloris). A body has its own limit (the app's body_timeout_s, a 408)."""

    header_timeout_s = HEADER_TIMEOUT_S

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.arm_header_timer()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self.arm_header_timer()

    def arm_header_timer(self) -> None:
        self.cycles = getattr(self, "cycles", 0) + 1
        if not self.transport.is_closing():
            self.loop.call_later(self.header_timeout_s, self.check_headers, self.cycles)

    def check_headers(self, cycle: int) -> None:
        """Still waiting for this cycle's headers: close (a request in progress, a
        later cycle or a closed connection: nothing to do)."""
        waiting = cycle == self.cycles and self.conn.their_state is h11.IDLE
        if waiting and not self.transport.is_closing():
            self.transport.close()


def listen_socket(host: str, port: int) -> socket.socket:
    """A socket bound to (host, port), not yet listening; raises OSError."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError:
        sock.close()
        raise
    return sock


class GracefulServer(uvicorn.Server):
    """uvicorn's server, telling the app's engine loop first when asked to stop."""

    def __init__(self, app: FastAPI, on_started: Callable[[], None]):
        config = uvicorn.Config(
            app,
            log_level="warning",
            timeout_graceful_shutdown=GRACE_S,
            http=H11WithHeaderTimeout,
        )
        super().__init__(config)
        self.app = app
        self.on_started = on_started

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            self.on_started()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """Every stop signal asks for the same graceful stop. uvicorn's second Ctrl-C
        would force an exit that skips the app's shutdown and cancels its lifespan
        (a logged traceback); the stop is quick anyway (open streams end at once),
        and the program's Ctrl-C watcher ends the process if it hangs (serve gives
        it 2 * GRACE_S: scripts/commands/interrupt.py's stop_gracefully_within)."""
        if not self.should_exit:
            self.app.state.engine_loop.shut_down()
        self._captured_signals.append(sig)
        self.should_exit = True

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        """uvicorn's, less its last act: it raises the signals it caught again
        while the event loop still runs, where the program's own Ctrl-C handler
        (SystemExit) cancels the app's tasks mid-shutdown and uvicorn logs a
        traceback. serve() raises them once the loop has closed."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        original = {
            sig: signal.signal(sig, self.handle_exit) for sig in HANDLED_SIGNALS
        }
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)


def serve(app: FastAPI, sock: socket.socket, on_started: Callable[[], None]) -> None:
    """Serve `app` on `sock` (from listen_socket) until a stop signal, which is then
    raised again for the program's own handler (Ctrl-C: one line, status 130)."""
    server = GracefulServer(app, on_started)
    server.run(sockets=[sock])
    for sig in reversed(server._captured_signals):
        signal.raise_signal(sig)
