"""Benchmarks run one after another, each in a process of its own, and their goals
read back from the JSON records they write (bench-speed).

    goals, failed = run_each(console, PARTS, folder, quick, solution, bench.keep)

A benchmark that ends with a status other than 0 (goals met) or 1 (a goal missed),
or writes no record or only a partial one (a failure after some of its parts),
counts as failed: its goals are unknown, so they are missed.
Each one that ran is kept as it ends (keep: Bench.keep), so that Ctrl-C later loses
no finished benchmark's goals.
"""

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from scripts.bench.benchlib.goals import Goal

# name -> the benchmark's module and its options
PARTS = {
    "engine": ["scripts.bench.bench_engine"],
    "paged": ["scripts.bench.bench_paged", "--parts", "chat", "kv"],
    "latency": ["scripts.bench.bench_latency"],
}


def run_each(
    console, parts: dict, folder: Path, quick: bool, solution: str, keep: Callable
) -> tuple[list[tuple[str, Goal]], list[str]]:
    """([(part, goal)] of every benchmark that ran, [parts that failed]); each one
    that ran is passed to keep(name, {"record": its record}, its goals)."""
    goals, failed = [], []
    folder.mkdir(parents=True, exist_ok=True)
    for name, (module, *options) in parts.items():
        record = folder / f"speed-{name}{'-quick' * quick}.json"
        record.unlink(missing_ok=True)  # a record left from another run says nothing
        command = [sys.executable, "-m", module, *options, "--out", str(record)]
        command += ["--solution", solution] + ["--quick"] * quick
        console.rule(f"{name}: {' '.join(command[2:])}")
        status = subprocess.run(command).returncode
        written = json.loads(record.read_text()) if record.exists() else {}
        if status not in (0, 1) or not written or written.get("partial"):
            failed.append(f"{name} (exit status {status})")
            continue
        fields = ("name", "value", "bound", "why", "at_most")
        part_goals = [Goal(**{k: g[k] for k in fields}) for g in written["goals"]]
        goals += [(name, goal) for goal in part_goals]
        keep(name, {"record": str(record)}, part_goals)
    return goals, failed
