"""A day's tests need nothing the skeleton labels later: in the reference run, the
tests of the days in CHECKED_DAYS run with every reference function that the
skeleton (src/tiny_llm) labels a later day made to raise, as in a learner's package
finished up to that day (conftest.py applies it to each of those days' modules).

Checked in the same run as the day's own tests, so they run once, not twice.
"""

import ast
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
UNTOUCHED_SKELETON = (
    "checks the untouched course skeleton src/tiny_llm, as shipped, not your work: "
    "runs in the reference run (pdm run test-refsol)"
)
# Week 2 day 6: its scheduler is where day 7's work is easiest to need. Week 3
# day 1: its engine tests reach for the paged cache (a learner's walk found one
# that did). Week 3 day 2: its paged cache is where day 3's prefix caching is.
CHECKED_DAYS = {(2, 6), (3, 1), (3, 2)}
DAY_LABEL = re.compile(r"Week (\d+) Day (\d+)")
TEST_FILE_DAY = re.compile(r"test_week_(\d+)_day_(\d+)(_\w+)?$")


def skeleton_modules() -> list[Path]:
    return sorted(
        p for p in (ROOT / "src/tiny_llm").glob("*.py") if p.name != "__init__.py"
    )


def labelled_day(function: ast.FunctionDef) -> tuple[int, int] | None:
    """(week, day) that a skeleton function's NotImplementedError names, if any."""
    for node in ast.walk(function):
        if isinstance(node, ast.Raise) and node.exc is not None:
            match = DAY_LABEL.search(ast.unparse(node.exc))
            if match:
                return int(match[1]), int(match[2])
    return None


def checked_day(module_name: str) -> tuple[int, int] | None:
    """(week, day) of a test module such as tests.test_week_3_day_1_engine, when
    that day is in CHECKED_DAYS."""
    match = TEST_FILE_DAY.search(module_name)
    day = (int(match[1]), int(match[2])) if match else None
    return day if day in CHECKED_DAYS else None


@contextmanager
def later_days_stubbed(week: int, day: int) -> Iterator[list[str]]:
    """Within the block, every reference function that the skeleton labels later
    than (week, day) raises NotImplementedError saying so; yields their names."""
    import tiny_llm_ref  # here: a learner's run never loads the reference

    def stub(name: str, label: tuple[int, int]):
        def unwritten(*args, **kwargs):
            raise NotImplementedError(
                f"Week {week} Day {day}'s tests need {name}, which the skeleton "
                f"labels Week {label[0]} Day {label[1]}: label it with the day that "
                f"first needs it (this {UNTOUCHED_SKELETON})"
            )

        return unwritten

    stubbed = []
    with pytest.MonkeyPatch.context() as patch:
        for path in skeleton_modules():
            module = getattr(tiny_llm_ref, path.stem)
            for node in ast.parse(path.read_text()).body:
                functions = (
                    [(module, node)] if isinstance(node, ast.FunctionDef) else []
                )
                if isinstance(node, ast.ClassDef):
                    owner = getattr(module, node.name)
                    functions = [
                        (owner, item)
                        for item in node.body
                        if isinstance(item, ast.FunctionDef)
                    ]
                for owner, function in functions:
                    label = labelled_day(function)
                    if label is None or label <= (week, day):
                        continue
                    name = f"{path.stem}.{function.name}"
                    replacement = stub(name, label)
                    if any(
                        ast.unparse(d) == "property" for d in function.decorator_list
                    ):
                        replacement = property(replacement)
                    patch.setattr(owner, function.name, replacement)
                    if owner is module and hasattr(tiny_llm_ref, function.name):
                        patch.setattr(tiny_llm_ref, function.name, replacement)
                    stubbed.append(name)
        assert stubbed, f"nothing is labelled after Week {week} Day {day}"
        yield stubbed
