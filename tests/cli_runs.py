"""Running the commands as the tests do: `main` inside the test process, for the many
checks that a bad option or input ends in one `error:` line with its status (a new
interpreter per case took most of the command tests' time); in a subprocess, for what
only a process shows (the one-line wrapper, Ctrl-C, start-up lines), each command at
least once; and the server's CLI with its stderr read as it comes.
"""

import importlib.util
import io
import os
import runpy
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from .solution import SOLUTION

ROOT = Path(__file__).resolve().parents[1]


def run_in_subprocess(
    target: str, *args: str, stdin: str | bytes | None = None, env=None
) -> subprocess.CompletedProcess:
    """`target` (a module name, or a script such as "main.py" in the repository's
    root) run to its end in a new interpreter, its output decoded; stdin None is
    /dev/null, which is not a pipe: a command does not read it. env: variables to
    set on top of this process's."""
    data = stdin.encode() if isinstance(stdin, str) else stdin
    command = [target] if target.endswith(".py") else ["-m", target]
    result = subprocess.run(
        [sys.executable, *command, *args],
        cwd=ROOT,
        input=data,
        stdin=subprocess.DEVNULL if data is None else None,
        capture_output=True,
        env={**os.environ, **(env or {})},
        timeout=300,
    )
    result.stdout, result.stderr = result.stdout.decode(), result.stderr.decode()
    return result


def assert_one_line_error(result, status: int, message: str) -> None:
    """Exit status `status`, no traceback, and one `error:` line, the last one,
    that holds `message`."""
    lines = result.stderr.splitlines()
    assert result.returncode == status, result.stderr
    assert "Traceback" not in result.stderr
    assert [line for line in lines if line.startswith("error:")] == [lines[-1]], lines
    assert lines[-1].startswith("error: ") and message in lines[-1], lines


def run_in_process(
    target: str, *args: str, stdin: str | bytes | None = None, env=None
) -> subprocess.CompletedProcess:
    """`target` (a module name, or a script such as "main.py" in the repository's
    root) run as __main__ with `args`, its exit status and output captured. stdin
    None is nothing on standard input; text or bytes come through a pipe, as `echo
    ... |` gives them. env: variables set for the run. Ctrl-C handling is left out:
    it would take over this process's SIGINT. The embedded model (no --model) is
    loaded once per test process and handed to every run (embedded_once): loading
    it is most of a short run's time, and the runs only read it; a --model folder
    is loaded each time, as the user's command does."""
    import tiny_llm_base

    from scripts.commands import interrupt

    if target.endswith(".py"):
        path = str(ROOT / target)
    else:  # by its path: pytest's assertion rewriter claims modules named *_test.py
        path = importlib.util.find_spec(target).origin
    out, err = io.StringIO(), io.StringIO()
    with ExitStack() as stack, pytest.MonkeyPatch.context() as patch:
        patch.setattr(interrupt, "exit_on_interrupt", lambda: None)
        patch.setattr(interrupt, "unwind_on_interrupt", lambda: None)
        patch.setattr(sys, "argv", [path, *args])
        patch.setattr(tiny_llm_base, "load_model", embedded_once)
        for name, value in (env or {}).items():
            patch.setenv(name, value)
        if stdin is None:  # no file number: read as nothing piped
            patch.setattr(sys, "stdin", io.StringIO())
        else:
            patch.setattr(sys, "stdin", stack.enter_context(piped(stdin)))
        try:
            with redirect_stderr(err), redirect_stdout(out):
                runpy.run_path(path, run_name="__main__")
            status = 0
        except SystemExit as exit:
            status = exit.code if isinstance(exit.code, int) else int(bool(exit.code))
            if isinstance(exit.code, str):  # sys.exit("message") prints it
                err.write(exit.code + "\n")
    return subprocess.CompletedProcess(
        [target, *args], status, out.getvalue(), err.getvalue()
    )


_loaded: dict = {}


def embedded_once(name=None, progress=None):
    """tiny_llm_base.load_model, with the embedded model's (mlx_model, tokenizer)
    loaded once per TINY_LLM_MODELS folder and kept."""
    from tiny_llm_base import loader

    if name is not None:
        return loader.load_model(name, progress)
    key = os.environ.get("TINY_LLM_MODELS")
    if key not in _loaded:
        _loaded[key] = loader.load_model(None, progress)
    return _loaded[key]


@contextmanager
def piped(data: str | bytes) -> Iterator[io.TextIOWrapper]:
    """The reading end of a pipe that carries `data` and then ends, as a text
    file like sys.stdin; a thread writes, so data may exceed the pipe's buffer."""
    data = data.encode() if isinstance(data, str) else data
    read_end, write_end = os.pipe()

    def write() -> None:
        try:
            with open(write_end, "wb") as writer:
                writer.write(data)
        except BrokenPipeError:  # the command left without reading it all
            pass

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    with open(read_end, encoding="utf-8") as reader:
        yield reader
    writer.join(timeout=10)


class ServeCli:
    """`python -m scripts.commands.serve --solution SOLUTION ARGS` in a subprocess
    (the package under test, tests/solution.py), for what only a process shows
    (start-up lines, signals). Its stderr is read on a thread;
    wait_for blocks until a line starts with a prefix (a readiness signal, never a
    guessed delay) or the process ends. Use as a context manager: it is killed on
    the way out if it still runs."""

    def __init__(self, *args: str, timeout_s: float = 180.0):
        self.timeout_s = timeout_s
        self.process = subprocess.Popen(
            [sys.executable, "-m", "scripts.commands.serve", "--solution", SOLUTION]
            + list(args),
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
