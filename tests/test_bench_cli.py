"""The benchmarks as commands (scripts/bench/bench*.py) stopped by Ctrl-C: each ends in
one line and status 130, never a traceback, with the parts that had finished kept in
its record (Bench.keep) and an earlier record left as it was when none had. Each
SIGINT goes out once the command has said on its output that it got that far (the
interrupt handler in place, a part running, the machine line), never after a guessed
delay. A --out that cannot be written: test_bench_harness.py."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from scripts.commands.interrupt import READY_LINE, READY_VARIABLE

from .fake_benchmark import WAITING_LINE
from .helpers import WAIT_S
from .solution import SOLUTION

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = sorted(path.stem for path in (ROOT / "scripts/bench").glob("bench*.py"))

# bench-speed with two stand-in benchmarks: one that ends with its record, one that
# runs until it is stopped.
FAKE_SPEED = """
import runpy
from scripts.bench.benchlib import speed_goals
speed_goals.PARTS = {
    "fake": ["tests.fake_benchmark"],
    "waits": ["tests.fake_benchmark", "--wait"],
}
runpy.run_module("scripts.bench.bench_speed", run_name="__main__", alter_sys=True)
"""


def start(*args: str, env=None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, *args],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, **(env or {})},
    )


def read_until(stream, text: str) -> None:
    """Read `stream` until `text` has come (the command got that far)."""
    seen = b""
    while text.encode() not in seen:
        byte = stream.read(1)
        assert byte, f"the command ended before {text!r}: {seen.decode()}"
        seen += byte


def interrupt(process: subprocess.Popen) -> tuple[int, str]:
    """SIGINT, then the exit status and the rest of stderr."""
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=WAIT_S)
    return process.returncode, stderr.decode()


@pytest.mark.parametrize("name", BENCHMARKS)
def test_ctrl_c_while_a_benchmark_imports_is_one_line(name):
    """Every benchmark's handler comes before its slow imports. The option it does
    not know would end a run without one at once, before the signal."""
    process = start(
        "-m", f"scripts.bench.{name}", "--no-such-option", env={READY_VARIABLE: "1"}
    )
    read_until(process.stderr, READY_LINE.decode())
    assert interrupt(process) == (130, "interrupted\n")


def test_ctrl_c_in_bench_speed_keeps_the_benchmarks_that_finished(tmp_path):
    out = tmp_path / "speed.json"
    process = start("-c", FAKE_SPEED, "--quick", "--out", str(out))
    read_until(process.stdout, WAITING_LINE)  # the first one has ended
    status, stderr = interrupt(process)
    assert status == 130 and "Traceback" not in stderr, stderr
    assert stderr.splitlines()[-1] == (
        f"interrupted: the finished parts (fake) are in {out}"
    )
    record = json.loads(out.read_text())
    assert (record["partial"], record["finished_parts"]) == (True, ["fake"])
    assert record["parts"] == {
        "fake": {"record": str(tmp_path / "speed-fake-quick.json")}
    }
    [goal] = record["goals"]  # the one fake_benchmark wrote
    assert (goal["name"], goal["value"], goal["met"]) == ("step", 2.0, False)


def test_ctrl_c_in_a_benchmark_with_nothing_finished_leaves_the_record(tmp_path):
    out = tmp_path / "engine.json"
    out.write_text("an earlier run's record")
    process = start(
        "-m", "scripts.bench.bench_engine", "--quick", "--solution", SOLUTION,
        "--out", str(out),
    )  # fmt: skip
    read_until(process.stdout, "load average")  # the machine line: the run is on
    status, stderr = interrupt(process)
    assert status == 130 and "Traceback" not in stderr, stderr
    assert stderr.splitlines()[-1] == "interrupted: no record written"
    assert out.read_text() == "an earlier run's record"
