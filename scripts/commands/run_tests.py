"""The course's test runner: `pdm run test --week 1 --day 3 [--task 2] [-- PYTEST_ARGS]`.

`--task K` runs only task K of the day: the tests marked `@pytest.mark.task(K)`
(tests/tasks.py); a task's tests pass once that task and the earlier ones are
written.

`pdm run test` checks the learner's package (src/tiny_llm); `pdm run test-refsol`
checks the reference (src/tiny_llm_ref). The exit status is pytest's, so CI fails
whenever a test fails. The whole suite runs its test files in parallel (pytest-xdist,
a file to a worker, so a module's server or model is built once): one worker per
core, at most 4 (each holds its own copy of the model); `--workers 1` runs them in
one process. A day's tests run in one process. With several workers each runs
OpenBLAS on its share of the cores (OPENBLAS_NUM_THREADS, unless set), so workers do
not spin-wait on each other's BLAS threads. The test processes write bytecode caches even where
PYTHONDONTWRITEBYTECODE is set: the suite starts many interpreters (workers,
servers, CLIs, ranks), and without the caches each one compiled every module it
imported from source again (mlx-lm, transformers, the clients), twice the CPU time
of its imports.

`--gpu-paths` runs only the tests marked device_branch, with TINY_LLM_DEVICE_PATHS=gpu:
the GPU's side of every device branch (tiny_llm_base.device), on any machine, a CPU
included. Only the files that mention device_branch are collected.
"""

import argparse
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# tiny_llm_base.device.PATHS_VARIABLE, spelled out: importing the package here would
# load mlx in this process before tests/conftest.py sets MLX_ENABLE_TF32.
PATHS_VARIABLE = "TINY_LLM_DEVICE_PATHS"
THREAD_VARIABLES = (
    "OPENBLAS_NUM_THREADS",
    "GOTO_NUM_THREADS",
    "OMP_NUM_THREADS",
)  # fast_blas.py's


def test_files(week: int | None, day: int | None) -> list[str]:
    if week is None and day is not None:
        sys.exit("error: --day needs --week")
    if week is None:
        return [str(ROOT / "tests")]
    # A day's suite may span several files: test_week_3_day_1.py, test_week_3_day_1_*.py.
    patterns = (
        [f"test_week_{week}_day_{day}.py", f"test_week_{week}_day_{day}_*.py"]
        if day
        else [f"test_week_{week}_day_*.py"]
    )
    files = sorted(str(p) for pat in patterns for p in (ROOT / "tests").glob(pat))
    if not files:
        sys.exit(f"error: no tests match week {week}" + (f" day {day}" if day else ""))
    return files


def device_branch_files(files: list[str]) -> list[str]:
    """The test files among `files` (files or folders) that mention device_branch
    (the mark, or a helper named after it), in any case."""
    found = []
    for name in files:
        path = Path(name)
        for file in sorted(path.glob("test_*.py")) if path.is_dir() else [path]:
            if "device_branch" in file.read_text().lower():
                found.append(str(file))
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--solution", choices=["learner", "ref"], default="learner")
    parser.add_argument("--week", type=int)
    parser.add_argument("--day", type=int)
    parser.add_argument(
        "--task",
        type=int,
        help="run only this task of the day (needs --week and --day)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        help="test processes for the whole suite (default: one per core, at most 4)",
    )
    parser.add_argument(
        "--gpu-paths",
        action="store_true",
        help="run the device_branch tests on the GPU's side of the device switch",
    )
    args, pytest_args = parser.parse_known_args()
    if pytest_args[:1] == ["--"]:
        pytest_args = pytest_args[1:]
    os.environ["TINY_LLM_SOLUTION"] = args.solution
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.dont_write_bytecode = False
    files = test_files(args.week, args.day)
    if args.gpu_paths:
        os.environ[PATHS_VARIABLE] = "gpu"
        files = device_branch_files(files)
        pytest_args = ["-m", "device_branch", *pytest_args]
    workers = args.workers
    if workers is None:
        workers = 1 if args.week or args.gpu_paths else min(4, os.cpu_count() or 1)
    if workers < 1:
        sys.exit(f"error: --workers must be at least 1, got {workers}")
    # Files in collection order (tests/conftest.py puts the long ones first), not
    # xdist's default of the files with the most tests first.
    parallel = ["-n", str(workers), "--dist", "loadfile", "--no-loadscope-reorder"]
    parallel = parallel if workers > 1 else []
    if workers > 1 and not any(os.environ.get(v) for v in THREAD_VARIABLES):
        cores = os.cpu_count() or 1
        os.environ["OPENBLAS_NUM_THREADS"] = str(max(1, cores // workers))
    if args.task is not None:
        pytest_args = [*task_option(args.week, args.day, args.task), *pytest_args]
    return pytest.main([*files, *parallel, *pytest_args])


def task_option(week: int | None, day: int | None, task: int) -> list[str]:
    """pytest's `--task K` (tests/conftest.py), once the day is known to have task K."""
    from tests.tasks import PENDING_DAYS, day_tasks

    if week is None or day is None:
        sys.exit("error: --task needs --week and --day")
    if (week, day) in PENDING_DAYS:
        sys.exit(
            f"error: week {week} day {day} is not cut into tasks yet: run the whole "
            f"day with `pdm run test --week {week} --day {day}`"
        )
    tasks = day_tasks(week, day)
    if task not in tasks:
        sys.exit(
            f"error: week {week} day {day} has tasks {tasks[0]}-{tasks[-1]}, "
            f"not task {task}"
            if tasks
            else f"error: week {week} day {day} has no tasks"
        )
    return ["--task", str(task)]


if __name__ == "__main__":
    sys.exit(main())
