"""Each day's tests are cut into tasks: `pdm run test --week 1 --day 5 --task 2` runs
task 2's tests only.

A test belongs to a task by its marker, `@pytest.mark.task(2)` on the test function,
or `pytestmark = pytest.mark.task(1)` for a whole file. The reference labels each
function a task asks for the same way, `# Week 1 Day 5 Task 2: ...`, and the day's
chapter lists its tasks under "## Your tasks". A day's tasks are numbered 1..N.

This module reads the markers from the test files' source (no import, no model
load), so the runner can name a day's tasks before pytest starts and
tests/test_tasks.py can check that every test of a day has exactly one task.
"""

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent

# Days whose tests are not cut into tasks yet: their chapters and engine code are
# being reworked, and their tasks come with that rework. `--task` on one of them
# says so; every other day's tests must each carry a task.
PENDING_DAYS: set[tuple[int, int]] = set()


def day_files(week: int, day: int) -> list[Path]:
    """The files `pdm run test --week W --day D` runs: test_week_W_day_D[_*].py."""
    return sorted(
        [
            *TESTS.glob(f"test_week_{week}_day_{day}.py"),
            *TESTS.glob(f"test_week_{week}_day_{day}_*.py"),
        ]
    )


def task_number(decorator: ast.expr) -> int | None:
    """N for a `pytest.mark.task(N)` expression, else None."""
    if (
        isinstance(decorator, ast.Call)
        and ast.unparse(decorator.func) == "pytest.mark.task"
        and len(decorator.args) == 1
        and isinstance(decorator.args[0], ast.Constant)
        and isinstance(decorator.args[0].value, int)
    ):
        return decorator.args[0].value
    return None


def file_tasks(path: Path) -> dict[str, list[int]]:
    """Each test function of a file and the task numbers its markers give it (a
    file-wide `pytestmark` counts for every test)."""
    tree = ast.parse(path.read_text())
    module_tasks = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets
        ):
            marks = (
                node.value.elts if isinstance(node.value, ast.List) else [node.value]
            )
            module_tasks += [n for n in map(task_number, marks) if n is not None]
    tests = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
            own = [n for n in map(task_number, node.decorator_list) if n is not None]
            tests[node.name] = module_tasks + own
    return tests


def day_tasks(week: int, day: int) -> list[int]:
    """The task numbers a day's tests use, in order (empty for a pending day)."""
    return sorted(
        {
            task
            for path in day_files(week, day)
            for tasks in file_tasks(path).values()
            for task in tasks
        }
    )
