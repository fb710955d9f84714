"""The learner skeleton and the reference expose the same public API, and the
skeleton's course functions fail loudly with NotImplementedError naming the day.

The API checks run against either package. The checks of the untouched skeleton
(every function raises NotImplementedError naming its day, and a day's tests need
nothing labelled later) run only in the reference run, `pdm run test-refsol`: in a
learner's run the skeleton is their work in progress, and a function they have
written is no failure.
"""

import ast
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import tiny_llm
import tiny_llm_ref

from .solution import SOLUTION

ROOT = Path(__file__).resolve().parents[1]
UNTOUCHED_SKELETON = (
    "checks the untouched course skeleton src/tiny_llm, as shipped, not your work: "
    "runs in the reference run (pdm run test-refsol)"
)
skeleton_check = pytest.mark.skipif(SOLUTION != "ref", reason=UNTOUCHED_SKELETON)


def public_api(package) -> dict[str, str]:
    api = {}
    for name in dir(package):
        value = getattr(package, name)
        if name.startswith("_") or inspect.ismodule(value):
            continue
        api[name] = describe(value)
        if inspect.isclass(value):
            for member, attr in vars(value).items():
                if inspect.isfunction(attr) and (
                    member == "__init__"
                    or member == "__call__"
                    or not member.startswith("_")
                ):
                    api[f"{name}.{member}"] = describe(attr)
    return api


def describe(value) -> str:
    """The signature, with annotations naming either package's classes alike."""
    try:
        signature = str(inspect.signature(value))
    except (TypeError, ValueError):
        return type(value).__name__
    return signature.replace("tiny_llm_ref.", "tiny_llm.")


def test_public_apis_are_identical():
    reference, learner = public_api(tiny_llm_ref), public_api(tiny_llm)
    assert sorted(reference) == sorted(learner), (
        "names differ between tiny_llm_ref and tiny_llm"
    )
    for name, signature in reference.items():
        assert learner[name] == signature, (
            f"{name}: reference {signature} != learner {learner[name]}"
        )


def test_learner_package_does_not_load_the_reference():
    code = "import sys, tiny_llm; print('tiny_llm_ref' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False", "import tiny_llm loaded tiny_llm_ref"


def test_nothing_outside_the_reference_imports_its_submodules():
    pattern = re.compile(r"(from|import)\s+tiny_llm_ref\.\w+")
    offenders = [
        str(path.relative_to(ROOT))
        for path in ROOT.glob("**/*.py")
        if "tiny_llm_ref" not in path.parts
        and ".venv" not in path.parts
        and pattern.search(path.read_text())
    ]
    assert offenders == [], f"import tiny_llm_ref's public names instead: {offenders}"


def skeleton_modules() -> list[Path]:
    return sorted(
        p for p in (ROOT / "src/tiny_llm").glob("*.py") if p.name != "__init__.py"
    )


DAY_LABEL = re.compile(r"Week (\d+) Day (\d+)")


def labelled_day(function: ast.FunctionDef) -> tuple[int, int] | None:
    """(week, day) that a skeleton function's NotImplementedError names, if any."""
    for node in ast.walk(function):
        if isinstance(node, ast.Raise) and node.exc is not None:
            match = DAY_LABEL.search(ast.unparse(node.exc))
            if match:
                return int(match[1]), int(match[2])
    return None


def stub_later_days(week: int, day: int) -> list[str]:
    """Make every reference function that the skeleton labels later than (week, day)
    raise instead, as in a learner's package finished up to that day; returns their
    names. Run in a subprocess: it breaks the reference for the rest of the process."""

    def stub(name: str):
        def unwritten(*args, **kwargs):
            raise NotImplementedError(f"{name} is labelled after Week {week} Day {day}")

        return unwritten

    stubbed = []
    for path in skeleton_modules():
        module = getattr(tiny_llm_ref, path.stem)
        for node in ast.parse(path.read_text()).body:
            functions = [(module, node)] if isinstance(node, ast.FunctionDef) else []
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
                replacement = stub(name)
                if any(ast.unparse(d) == "property" for d in function.decorator_list):
                    replacement = property(replacement)
                setattr(owner, function.name, replacement)
                if owner is module and hasattr(tiny_llm_ref, function.name):
                    setattr(tiny_llm_ref, function.name, replacement)
                stubbed.append(name)
    return stubbed


@skeleton_check
@pytest.mark.parametrize("week, day", [(2, 6), (3, 1), (3, 2)])
def test_a_days_tests_need_nothing_the_skeleton_labels_later(week, day):
    """Day 6's tests pass on the reference with every function the skeleton labels
    Day 7 or later made to raise: a learner who has done day 6 passes them. (Day 6
    is checked because its scheduler is where day 7's work is easiest to need;
    week 3 day 1 because its engine tests reach for the paged cache (a learner's
    walk found one that did); week 3 day 2 because its paged cache is where day 3's
    prefix caching is.)"""
    files = [
        str(p.relative_to(ROOT))
        for pattern in (
            f"test_week_{week}_day_{day}.py",
            f"test_week_{week}_day_{day}_*.py",
        )
        for p in sorted((ROOT / "tests").glob(pattern))
    ]
    code = (
        "import sys, pytest\n"
        "from tests.test_api import stub_later_days\n"
        f"assert stub_later_days({week}, {day})\n"
        f"sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', *{files!r}]))\n"
    )
    env = dict(os.environ, TINY_LLM_SOLUTION="ref")
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, (
        f"Week {week} Day {day}'s tests need a function the skeleton labels later: "
        "label it with the day that first needs it "
        f"(this {UNTOUCHED_SKELETON})\n{result.stdout[-3000:]}{result.stderr[-2000:]}"
    )


@skeleton_check
def test_the_skeleton_is_made_from_the_reference():
    """src/tiny_llm is what `pdm run make-skeleton` makes of src/tiny_llm_ref: each
    docstring, signature and day message exists once, in the reference."""
    result = subprocess.run(
        [sys.executable, "-m", "scripts.tools.make_skeleton", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, (
        f"{result.stdout}{result.stderr}(this {UNTOUCHED_SKELETON})"
    )


@skeleton_check
@pytest.mark.parametrize("path", skeleton_modules(), ids=lambda p: p.name)
def test_every_course_function_raises_not_implemented_with_its_day(path):
    """Every reference function with a day comment is a stub in the skeleton that
    names the day; the week 2 day 6 engine and the week 3 managers are among them."""
    reference = (ROOT / "src/tiny_llm_ref" / path.name).read_text()
    marked = set(re.findall(r"\n\s*# (Week \d+ Day \d+):", reference))
    stubs = [
        ast.unparse(node.exc)
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Raise) and node.exc is not None
    ]
    for day in marked:
        stub_of_day = re.compile(rf"NotImplementedError\(['\"]{day}")
        assert any(stub_of_day.match(stub) for stub in stubs), (
            f"{path.name}: no stub names {day} (this {UNTOUCHED_SKELETON})"
        )
    course_modules = {"engine.py", "planner.py", "runner.py", "paged_manager.py"}
    if path.name in course_modules:
        assert marked, f"{path.name} has no course functions"


@skeleton_check
def test_untouched_skeleton_fails_with_not_implemented_not_import_errors():
    env = dict(os.environ, TINY_LLM_SOLUTION="learner")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-x",
            "-p",
            "no:cacheprovider",
            "tests/test_week_1_day_1.py",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 1, (
        f"the untouched skeleton should fail Week 1 Day 1 (this {UNTOUCHED_SKELETON})"
        f"\n{result.stdout[-2000:]}"
    )
    assert "NotImplementedError: Week 1 Day 1" in result.stdout
    assert (
        "ImportError" not in result.stdout
        and "errors during collection" not in result.stdout
    )
