"""Ctrl-C for the command-line programs: one line, status 130, never a traceback.

A program installs the handler as its first statement. Until then Ctrl-C raises
KeyboardInterrupt inside whatever is being imported, with a traceback (tqdm alone
takes a third of a second to import), so this module imports only modules built
into the interpreter: `signal` and `threading` would import enum, functools and
collections first, so it uses `_signal` and `_thread`, the C modules under them.
"""

import _signal
import _thread
import atexit
import os
import sys
import time

INTERRUPTED_STATUS = 130  # 128 + SIGINT, what a shell reports for Ctrl-C
FORCED_EXIT_AFTER_S = 0.5
# With this variable set, a program says on stderr once its handler is in place.
READY_VARIABLE = "TINY_LLM_SAY_INTERRUPTIBLE"
READY_LINE = b"interruptible\n"
unwinding = [False]  # set by unwind_on_interrupt once the slow imports are done
forced_exit_after_s = [FORCED_EXIT_AFTER_S]  # longer once a graceful stop is in place
interrupted = [False]  # set by the handler once it has raised SystemExit
said = [""]  # after "interrupted" on Ctrl-C's line: set by say_when_interrupted


def say_when_interrupted(detail: str) -> None:
    """From now on Ctrl-C's line is `interrupted: detail`: what the program has kept
    (a benchmark's finished parts) or not. Set beforehand, never at the interrupt:
    the watcher may end the process before the main thread runs again."""
    said[0] = f": {detail}"


def unwind_on_interrupt() -> None:
    """From now on Ctrl-C raises SystemExit, so that `with` blocks restore the
    terminal. Before, while the program imports, it ends the process at once: a
    SystemExit raised inside a C extension's initialisation (mlx.core's) comes out as
    an ImportError with a traceback."""
    unwinding[0] = True


def stop_gracefully_within(seconds: float) -> None:
    """From now on the program's own handler answers Ctrl-C with a graceful stop
    (the server ends open streams with an error event): the watcher waits
    `seconds` before ending the process, not FORCED_EXIT_AFTER_S, so a stop
    slowed by a loaded machine is not cut in the middle."""
    forced_exit_after_s[0] = seconds


def settle_mlx() -> None:
    """Wait for MLX work still queued (the engine starts a forward a step ahead): a
    process that exits with MLX work in flight aborts ("terminate called")."""
    mx = sys.modules.get("mlx.core")
    if mx is not None:
        mx.synchronize()


def leave_now() -> None:
    """End an interrupted process once its own exit handlers have run, before the
    interpreter's finalization: a C++ library's static objects torn down beside a
    thread still alive in it abort the process ("terminate called", seen on Ctrl-C
    under load), where status 130 and one line are due."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, ValueError, OSError):
            pass
    os._exit(INTERRUPTED_STATUS)


def exit_on_interrupt() -> None:
    """Make Ctrl-C end the program at once: one line on stderr, status 130, no traceback.

    The handler raises SystemExit, so `with` blocks still restore the terminal, and
    the line is printed at exit, below whatever they leave. MLX computes with the GIL
    released, so a long prefill would keep the main thread from running the handler
    until it returns: a watcher thread, woken by the signal itself through
    set_wakeup_fd, ends the process if the main thread has not within
    FORCED_EXIT_AFTER_S (or stop_gracefully_within's time). A second Ctrl-C kills at
    once (the default action) unless the program handles it.
    """
    announced = _thread.allocate_lock()

    def announce_once() -> None:
        # os.write, not print: the watcher thread may announce while the main
        # thread's exit finalizes sys.stderr, and a print there is lost silently.
        if announced.acquire(False):
            try:
                prefix = "\n" if sys.stderr.isatty() else ""
                sys.stderr.flush()  # what the program wrote comes first
            except (AttributeError, ValueError, OSError):
                prefix = ""
            os.write(2, f"{prefix}interrupted{said[0]}\n".encode())

    def on_interrupt(signum, frame) -> None:
        _signal.signal(_signal.SIGINT, _signal.SIG_DFL)
        if not unwinding[0]:
            announce_once()
            os._exit(INTERRUPTED_STATUS)
        atexit.register(leave_now)  # handlers run last first: after the two below
        atexit.register(settle_mlx)
        atexit.register(announce_once)  # last: after progress bars clear their lines
        interrupted[0] = True
        raise SystemExit(INTERRUPTED_STATUS)

    default_hook = sys.excepthook

    def quiet_once_interrupted(kind, error, traceback) -> None:
        # Python can wrap the SystemExit in another exception: raised inside a
        # descriptor's __set_name__ (a dataclass that a lazy import defines) it
        # comes out as "RuntimeError: Error calling __set_name__". The exit is
        # still the interrupt's: status 130 and its one line (atexit), no traceback.
        if not interrupted[0]:
            default_hook(kind, error, traceback)

    def watch(wakeups: int) -> None:
        while os.read(wakeups, 1) != bytes([_signal.SIGINT]):
            pass
        time.sleep(forced_exit_after_s[0])
        announce_once()
        if sys.stdout.isatty():
            sys.stdout.write("\x1b[?25h")  # show the cursor a live display hid
        sys.stdout.flush()
        os._exit(INTERRUPTED_STATUS)

    wakeups, wakeup_writes = os.pipe()
    os.set_blocking(wakeup_writes, False)
    _signal.set_wakeup_fd(wakeup_writes, warn_on_full_buffer=False)
    _signal.signal(_signal.SIGINT, on_interrupt)
    sys.excepthook = quiet_once_interrupted
    _thread.start_new_thread(watch, (wakeups,))  # never joined: exit does not wait
    if os.environ.get(READY_VARIABLE):  # tests wait for this, not for a guessed delay
        os.write(2, READY_LINE)
