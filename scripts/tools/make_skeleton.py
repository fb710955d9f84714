"""Make the learner's package, src/tiny_llm, from the reference, src/tiny_llm_ref.

    pdm run make-skeleton            # rewrite src/tiny_llm
    pdm run make-skeleton --check    # exit 1 and name the files that would change
    pdm run make-skeleton --done-through 2.7   # a learner's tree, week 2 finished
    pdm run make-skeleton --done-through 1.5.2 # ... and week 1 day 5's tasks 1-2

A reference function whose body begins (after its docstring, if any) with a comment
naming a day,

    def step(self) -> list[RequestOutput]:
        \"\"\"One iteration: ...\"\"\"
        # Week 2 Day 6: read the inbox, admit arrivals, plan, run, report.
        ...

becomes in the skeleton that signature, that docstring and
`raise NotImplementedError("Week 2 Day 6: read the inbox, ...")`. A day cut into
tasks names the task too (`# Week 1 Day 5 Task 2: ...`), and the stub's message
begins `Week 1 Day 5 Task 2:`. Every other line is copied as it is. So a signature, a docstring and a day's message exist once, in
the reference, and the skeleton cannot drift from it: tests/test_api.py fails when
the checked-in skeleton differs from what this command makes.
"""

import argparse
import ast
import re
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "src" / "tiny_llm_ref"
SKELETON = ROOT / "src" / "tiny_llm"
DAY_COMMENT = re.compile(r"^(\s*)# (Week \d+ Day \d+(?: Task \d+)?: .*)$")
LABEL = re.compile(r"Week (\d+) Day (\d+)(?: Task (\d+))?:")
PACKAGE_DOCSTRING = '''"""tiny-llm, your implementation: the course functions raise NotImplementedError until
you write them. Infrastructure (fast BLAS, model loading, the objects the scheduler
reports in) comes from tiny_llm_base, never from the reference."""
'''


def day_comment(lines: list[str], start: int) -> tuple[str, int] | None:
    """The day's message that starts at line index `start`, and the index after its
    last comment line; None when no day comment starts there."""
    match = DAY_COMMENT.match(lines[start])
    if match is None:
        return None
    indent, words = match[1], [match[2]]
    end = start + 1
    continuation = re.compile(rf"^{indent}# (?!Week \d+ Day \d+)(.*)$")
    while end < len(lines) and (more := continuation.match(lines[end])):
        words.append(more[1])
        end += 1
    return " ".join(words), end


def functions(tree: ast.Module) -> list[ast.FunctionDef]:
    """Module-level functions and the methods of module-level classes."""
    found = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            found.append(node)
        elif isinstance(node, ast.ClassDef):
            found += [f for f in node.body if isinstance(f, ast.FunctionDef)]
    return found


def body_start(function: ast.FunctionDef, lines: list[str]) -> int:
    """The index of the body's first line after the docstring, comments included."""
    first = function.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
        return first.end_lineno
    start = first.lineno - 1
    while start > function.lineno and lines[start - 1].lstrip().startswith("#"):
        start -= 1
    return start


def raise_lines(indent: str, message: str) -> list[str]:
    """`raise NotImplementedError(message)`, the message split into string pieces
    that keep each line within 88 characters."""
    width = 88 - len(indent) - 8
    pieces = textwrap.wrap(message, width, drop_whitespace=False) or [""]
    if len(pieces) == 1:
        return [f"{indent}raise NotImplementedError({message!r})"]
    body = [f"{indent}    {piece!r}" for piece in pieces]
    return [f"{indent}raise NotImplementedError(", *body, f"{indent})"]


ALL_TASKS = 1_000  # --done-through W.D: every task of the day


def day_of(message: str) -> tuple[int, int, int]:
    """(week, day, task) of a day's message; task 0 for a day not cut into tasks."""
    week, day, task = LABEL.match(message).groups()
    return int(week), int(day), int(task or 0)


def skeleton_of(source: str, done: tuple[int, int, int] = (0, 0, 0)) -> str:
    """The skeleton of one reference module's source; functions of the days (and
    tasks) up to `done` (week, day, task) keep their reference bodies."""
    lines = source.splitlines()
    replacements = []  # (first index, end index, new lines), in file order
    for function in functions(ast.parse(source)):
        start = body_start(function, lines)
        found = day_comment(lines, start) if start < len(lines) else None
        if found is None:
            continue
        message, _ = found
        if day_of(message) <= done:
            continue
        indent = DAY_COMMENT.match(lines[start])[1]
        replacements.append((start, function.end_lineno, raise_lines(indent, message)))
    for first, end, new in reversed(replacements):
        lines[first:end] = new
    return "\n".join(lines) + "\n"


def formatted(source: str, name: str) -> str:
    """The source as `ruff format` writes it."""
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--stdin-filename", name, "-"],
        input=source,
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    return result.stdout


def expected_skeleton(done: tuple[int, int, int] = (0, 0, 0)) -> dict[Path, str]:
    """Every file of src/tiny_llm as the reference makes it, the days up to `done`
    already written."""
    files = {}
    for path in sorted(REFERENCE.glob("*.py")):
        source = path.read_text()
        if path.name == "__init__.py":
            body = source.split('"""', 2)[2].lstrip("\n")
            text = PACKAGE_DOCSTRING + "\n" + body
        else:
            text = skeleton_of(source, done)
        files[SKELETON / path.name] = formatted(text, str(SKELETON / path.name))
    return files


def differences(done: tuple[int, int, int] = (0, 0, 0)) -> list[Path]:
    """The skeleton files that are missing, differ, or have no reference module."""
    expected = expected_skeleton(done)
    changed = [
        p for p, text in expected.items() if not p.exists() or p.read_text() != text
    ]
    extra = [p for p in SKELETON.glob("*.py") if p not in expected]
    return changed + extra


def course_tasks() -> dict[tuple[int, int], list[int]]:
    """Every (week, day) the reference labels, in order, with its task numbers
    (empty for a day not cut into tasks)."""
    labels = re.compile(r"# Week (\d+) Day (\d+)(?: Task (\d+))?:")
    days: dict[tuple[int, int], set[int]] = {}
    for path in REFERENCE.glob("*.py"):
        for week, day, task in labels.findall(path.read_text()):
            tasks = days.setdefault((int(week), int(day)), set())
            if task:
                tasks.add(int(task))
    return {day: sorted(days[day]) for day in sorted(days)}


def course_days() -> list[tuple[int, int]]:
    """Every (week, day) the reference labels, in order."""
    return list(course_tasks())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check",
        action="store_true",
        help="change nothing; exit 1 naming the files that differ",
    )
    parser.add_argument(
        "--done-through",
        metavar="WEEK.DAY[.TASK]",
        help="keep the reference's code for every day up to this one (e.g. 2.7): "
        "a learner's tree with those days finished; WEEK.DAY.TASK (e.g. 1.5.2) "
        "also keeps that day's tasks up to TASK",
    )
    args = parser.parse_args()
    done = (0, 0, 0)
    if args.done_through is not None:
        match = re.fullmatch(r"(\d+)\.(\d+)(?:\.(\d+))?", args.done_through)
        if match is None:
            parser.error("--done-through takes WEEK.DAY or WEEK.DAY.TASK, such as 2.7")
        tasks = course_tasks()
        days = list(tasks)
        if not days:
            parser.error(
                "the skeleton is made from src/tiny_llm_ref, which this tree does "
                "not have"
            )
        day = (int(match[1]), int(match[2]))
        if day not in tasks:
            parser.error(
                f"the course has no week {day[0]} day {day[1]}: its days run from "
                f"{days[0][0]}.{days[0][1]} to {days[-1][0]}.{days[-1][1]}"
            )
        task = ALL_TASKS if match[3] is None else int(match[3])
        if match[3] is not None and task not in tasks[day]:
            have = (
                f"tasks {tasks[day][0]}-{tasks[day][-1]}"
                if tasks[day]
                else "no tasks yet"
            )
            parser.error(f"week {day[0]} day {day[1]} has {have}, not task {task}")
        done = (*day, task)
    if args.check:
        stale = differences(done)
        for path in stale:
            print(f"differs from the reference: {path.relative_to(ROOT)}")
        if stale:
            same = f" --done-through {args.done_through}" if args.done_through else ""
            print(f"run `pdm run make-skeleton{same}` to remake src/tiny_llm")
        return 1 if stale else 0
    expected = expected_skeleton(done)
    for path in SKELETON.glob("*.py"):
        if path not in expected:
            path.unlink()
    for path, text in expected.items():
        path.write_text(text)
    print(f"wrote {len(expected)} files in {SKELETON.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
