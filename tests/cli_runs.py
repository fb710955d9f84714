"""Running a command's `main` inside the test process, for the many checks that a
bad option or input ends in one `error:` line with its status: a new interpreter per
case took most of the command tests' time. Each command still has a test that runs
it in a subprocess, for what only a process shows (the one-line wrapper, Ctrl-C).
"""

import importlib.util
import io
import os
import runpy
import subprocess
import sys
import threading
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_in_process(target: str, *args: str) -> subprocess.CompletedProcess:
    """`target` (a module name, or a script such as "main.py" in the repository's
    root) run as __main__ with `args`, its exit status and output captured, nothing
    on standard input. Ctrl-C handling is left out: it would take over this
    process's SIGINT."""
    from scripts.commands import interrupt

    if target.endswith(".py"):
        path = str(ROOT / target)
    else:  # by its path: pytest's assertion rewriter claims modules named *_test.py
        path = importlib.util.find_spec(target).origin
    saved = (sys.argv, sys.stdin, interrupt.exit_on_interrupt,
             interrupt.unwind_on_interrupt)  # fmt: skip
    interrupt.exit_on_interrupt = interrupt.unwind_on_interrupt = lambda: None
    sys.argv = [path, *args]
    sys.stdin = io.StringIO()  # no file number: read as nothing piped
    out, err = io.StringIO(), io.StringIO()
    try:
        with redirect_stderr(err), redirect_stdout(out):
            runpy.run_path(path, run_name="__main__")
        status = 0
    except SystemExit as exit:
        status = exit.code if isinstance(exit.code, int) else int(bool(exit.code))
        if isinstance(exit.code, str):  # sys.exit("message") prints it
            err.write(exit.code + "\n")
    finally:
        (sys.argv, sys.stdin, interrupt.exit_on_interrupt,
         interrupt.unwind_on_interrupt) = saved  # fmt: skip
    return subprocess.CompletedProcess(sys.argv, status, out.getvalue(), err.getvalue())


class ServeCli:
    """`python -m scripts.commands.serve ARGS` in a subprocess, for what only a
    process shows (start-up lines, signals). Its stderr is read on a thread;
    wait_for blocks until a line starts with a prefix (a readiness signal, never a
    guessed delay) or the process ends. Use as a context manager: it is killed on
    the way out if it still runs."""

    def __init__(self, *args: str, timeout_s: float = 180.0):
        self.timeout_s = timeout_s
        self.process = subprocess.Popen(
            [sys.executable, "-m", "scripts.commands.serve", *args],
            cwd=ROOT,
            env={k: v for k, v in os.environ.items() if k != "TINY_LLM_API_KEY"},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self.changed = threading.Condition()
        self.reader = threading.Thread(target=self.read, daemon=True)
        self.reader.start()

    def read(self) -> None:
        for line in self.process.stderr:
            with self.changed:
                self.lines.append(line)
                self.changed.notify_all()
        with self.changed:
            self.changed.notify_all()

    def wait_for(self, prefix: str) -> str:
        """The first stderr line that starts with `prefix`."""

        def found():
            return next((x for x in self.lines if x.startswith(prefix)), None)

        with self.changed:
            done = self.changed.wait_for(
                lambda: found() is not None or not self.reader.is_alive(),
                timeout=self.timeout_s,
            )
            line = found()
        assert line is not None, (
            f"no line starting {prefix!r} "
            f"({'timed out' if not done else 'the server ended'}):\n"
            + "".join(self.lines)
        )
        return line

    @property
    def log(self) -> str:
        self.reader.join(timeout=5)
        return "".join(self.lines)

    def __enter__(self) -> "ServeCli":
        return self

    def __exit__(self, *exc) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
