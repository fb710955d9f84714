"""Every day is cut into tasks 1..N (tests/tasks.py): each test of a day's files
carries exactly one task, the reference labels every function of the day with one
of those tasks, and the day's chapter lists the same tasks, in order, under
"## Your tasks", each with its `pdm run test --week W --day D --task K`. The days
in PENDING_DAYS are not cut yet, and say so: none of their tests has a task."""

import re
from pathlib import Path

import pytest

from .tasks import PENDING_DAYS, TESTS, day_files, day_tasks, file_tasks

ROOT = TESTS.parent
REFERENCE = ROOT / "src" / "tiny_llm_ref"
BOOK = ROOT / "book" / "src"
DAY_FILE = re.compile(r"test_week_(\d+)_day_(\d+)(_\w+)?\.py")
LABEL = re.compile(r"# Week (\d+) Day (\d+)(?: Task (\d+))?:")
CHAPTER = re.compile(r"week(\d+)-0*(\d+)-.*\.md")


def course_days() -> list[tuple[int, int]]:
    days = set()
    for path in TESTS.glob("test_week_*_day_*.py"):
        match = DAY_FILE.fullmatch(path.name)
        days.add((int(match[1]), int(match[2])))
    return sorted(days)


DAYS = [day for day in course_days() if day not in PENDING_DAYS]


def reference_labels(week: int, day: int) -> list[int | None]:
    """The task of every reference function labelled with this day (None: no task)."""
    return [
        int(task) if task else None
        for path in REFERENCE.glob("*.py")
        for w, d, task in LABEL.findall(path.read_text())
        if (int(w), int(d)) == (week, day)
    ]


def chapters(week: int, day: int) -> list[Path]:
    found = []
    for path in BOOK.glob("week*.md"):
        match = CHAPTER.fullmatch(path.name)
        if match and (int(match[1]), int(match[2])) == (week, day):
            found.append(path)
    return sorted(found)


def test_pending_days_are_days_of_the_course_without_tasks():
    for week, day in sorted(PENDING_DAYS):
        assert day_files(week, day), f"week {week} day {day} has no test files"
        assert day_tasks(week, day) == [], (
            f"week {week} day {day} has tasks now: take it off tests/tasks.py's "
            "PENDING_DAYS"
        )


@pytest.mark.parametrize("day", DAYS, ids=lambda d: f"week{d[0]}-day{d[1]}")
def test_every_test_of_a_day_has_one_task(day):
    problems = []
    for path in day_files(*day):
        for name, tasks in file_tasks(path).items():
            if len(tasks) != 1:
                problems.append(f"{path.name}::{name} has tasks {tasks}")
    assert not problems, "each test needs one @pytest.mark.task(K):\n" + "\n".join(
        problems
    )
    tasks = day_tasks(*day)
    assert tasks == list(range(1, len(tasks) + 1)) and tasks, (
        f"week {day[0]} day {day[1]}'s tasks are {tasks}, not 1..N"
    )


@pytest.mark.parametrize("day", DAYS, ids=lambda d: f"week{d[0]}-day{d[1]}")
def test_the_reference_labels_every_function_with_a_task_of_its_day(day):
    labels = reference_labels(*day)
    assert None not in labels, (
        f"a reference function of week {day[0]} day {day[1]} has no task: label it "
        f"`# Week {day[0]} Day {day[1]} Task K: ...`"
    )
    assert sorted(set(labels)) == day_tasks(*day), (
        f"week {day[0]} day {day[1]}: the reference labels tasks "
        f"{sorted(set(labels))}, the tests mark {day_tasks(*day)}"
    )


MAX_DAY_STUBS = 40


@pytest.mark.parametrize("day", course_days(), ids=lambda d: f"week{d[0]}-day{d[1]}")
def test_no_day_holds_more_than_40_stubs(day):
    """A day a learner can finish in a sitting: what the day does not teach is
    given code, or moves to the day that teaches it."""
    stubs = len(reference_labels(*day))
    assert stubs <= MAX_DAY_STUBS, (
        f"week {day[0]} day {day[1]} labels {stubs} functions, over "
        f"{MAX_DAY_STUBS}: give what the day does not teach, or move it"
    )


@pytest.mark.parametrize("day", DAYS, ids=lambda d: f"week{d[0]}-day{d[1]}")
def test_the_chapter_lists_the_tasks_in_order(day):
    """A day too long for one chapter may list its tasks over two (Week 3 Day 2's
    paged cache and its keys in fewer bytes): together they list each task once."""
    week, number = day
    texts = [path.read_text() for path in chapters(week, number)]
    assert texts, f"week {week} day {number} has no chapter"
    sections = [
        t.split("\n## Your tasks", 1)[1].split("\n## ", 1)[0]
        for t in texts
        if "\n## Your tasks" in t
    ]
    assert sections, f"week {week} day {number}'s chapter has no ## Your tasks"
    listed = [
        int(n)
        for section in sections
        for n in re.findall(r"^\*\*Task (\d+):", section, re.M)
    ]
    assert sorted(listed) == day_tasks(week, number), (
        f"week {week} day {number}'s chapters list tasks {listed}, the tests have "
        f"{day_tasks(week, number)} (each as a line starting **Task K:**)"
    )
    for section in sections:
        numbers = [int(n) for n in re.findall(r"^\*\*Task (\d+):", section, re.M)]
        assert numbers == sorted(numbers), f"tasks out of order: {numbers}"
        for task in numbers:
            command = f"pdm run test --week {week} --day {number} --task {task}"
            assert command in section, f"the tasks never show `{command}`"
