"""Running a command's `main` inside the test process, for the many checks that a
bad option or input ends in one `error:` line with its status: a new interpreter per
case took most of the command tests' time. Each command still has a test that runs
it in a subprocess, for what only a process shows (the one-line wrapper, Ctrl-C).
"""

import importlib.util
import io
import runpy
import subprocess
import sys
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
