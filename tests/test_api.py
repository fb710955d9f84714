"""The learner skeleton and the reference expose the same public API, and the
skeleton's course functions fail loudly with NotImplementedError naming the day.

The API checks run against either package. The checks of the untouched skeleton
(every function raises NotImplementedError naming its day) run only in the
reference run, `pdm run test-refsol`: in a learner's run the skeleton is their work
in progress, and a function they have written is no failure. That a day's tests need
nothing labelled later is checked by those tests themselves (tests/later_days.py).
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

from .later_days import UNTOUCHED_SKELETON, later_days_stubbed, skeleton_modules
from .solution import SOLUTION

tiny_llm_ref = pytest.importorskip(
    "tiny_llm_ref",
    reason="needs src/tiny_llm_ref: it compares the two packages' public APIs",
)

ROOT = Path(__file__).resolve().parents[1]
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
        and ".cache" not in path.parts  # client-check's virtualenvs
        and pattern.search(path.read_text())
    ]
    assert offenders == [], f"import tiny_llm_ref's public names instead: {offenders}"


@skeleton_check
def test_a_day_runs_with_what_the_skeleton_labels_later_raising():
    """The stubs later_days puts in place for a day's tests (week 3 day 1 here):
    week 3 day 2's BlockPool raises, naming both days, and is itself again after."""
    with later_days_stubbed(3, 1) as stubbed:
        assert "block_pool.__init__" in stubbed
        with pytest.raises(NotImplementedError, match="labels Week 3 Day 2"):
            tiny_llm_ref.BlockPool(4, 2)
    assert tiny_llm_ref.BlockPool(4, 2).available == 4


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
    marked = set(re.findall(r"\n\s*# (Week \d+ Day \d+)(?: Task \d+)?:", reference))
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


# Reference code a day module ships whole in the skeleton, on purpose: each entry
# names the chapter that tells the learner it is given. Anything else in a day module
# longer than GIVEN_LINES lines is a stub of its day, or it hands out an answer.
GIVEN = {
    "engine.Engine.__init__": "week2-06-continuous-batching.md",
    "kv_manager.DenseKvManager.__init__": "week2-06-continuous-batching.md",
    "planner.Planner.chunk_size": "week2-06-continuous-batching.md",
    "request.Request.__post_init__": "week2-06-continuous-batching.md",
    "request.Request.accept_drawn": "week2-06-continuous-batching.md",
    "request.Request.result": "week2-06-continuous-batching.md",
    "automaton.Nfa.new_state": "week3-05-structured-outputs.md",
    "regex_parser.RegexParser.repeat": "week3-05-structured-outputs.md",
    "regex_parser.RegexParser.counted": "week3-05-structured-outputs.md",
    "regex_parser.RegexParser.atom": "week3-05-structured-outputs.md",
    "regex_parser.RegexParser.escape": "week3-05-structured-outputs.md",
    "regex_parser.RegexParser.char_class": "week3-05-structured-outputs.md",
    "token_index.check_spellable": "week3-05-structured-outputs.md",
    "tool_calls.check_tools": "week4-02-tool-calls.md",
    "draft_head.load_draft_head": "week4-03-learned-drafter.md",
    "draft_training.hidden_states": "week4-03-learned-drafter.md",
    # Week 2 day 6 is not cut into tasks yet (tests/tasks.py's PENDING_DAYS).
}
GIVEN_LINES = 8


def skeleton_functions(path: Path):
    """(qualified name, function) for every function and method of a skeleton module."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef):
            yield f"{path.stem}.{node.name}", node
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    yield f"{path.stem}.{node.name}.{item.name}", item


def is_stub(function: ast.FunctionDef) -> bool:
    """The body (after the docstring) is one `raise NotImplementedError("Week ...")`."""
    body = function.body
    if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    return (
        len(body) == 1
        and isinstance(body[0], ast.Raise)
        and re.search(r"Week \d+ Day \d+", ast.unparse(body[0])) is not None
    )


def body_lines(function: ast.FunctionDef) -> int:
    first = function.body[0]
    docstring = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
    start = first.end_lineno if docstring else first.lineno - 1
    return function.end_lineno - start


@skeleton_check
def test_no_answer_ships_in_the_skeleton():
    """In a module with a day's stubs, every function of more than GIVEN_LINES lines
    is a stub or on GIVEN, and each given one is named in its chapter: the skeleton
    hands out no day's answer unannounced."""
    found, problems = set(), []
    for path in skeleton_modules():
        functions = list(skeleton_functions(path))
        if not any(is_stub(f) for _, f in functions):
            continue
        for name, function in functions:
            if is_stub(function) or body_lines(function) <= GIVEN_LINES:
                continue
            found.add(name)
            if name not in GIVEN:
                problems.append(
                    f"{name} ({body_lines(function)} lines) ships whole in "
                    "src/tiny_llm: label it with its day and task in the reference, "
                    "or list it in GIVEN and name it in its chapter"
                )
    for name, chapter in GIVEN.items():
        if name not in found:
            problems.append(f"GIVEN lists {name}, which is no longer a given function")
        # A method is named by its own name or its class's (RegexParser: the parser).
        names = name.split(".")[1:]
        text = (ROOT / "book" / "src" / chapter).read_text()
        if not any(f"`{shown}" in text for shown in names):
            problems.append(f"{chapter} never names the given {name}")
    assert not problems, "\n".join(problems)


@skeleton_check
def test_untouched_skeleton_fails_a_task_alone_with_its_days_error():
    """`--task 3` runs only task 3's tests, and on the untouched skeleton they fail
    with Week 1 Day 1's NotImplementedError (tests/tasks.py)."""
    env = dict(os.environ, TINY_LLM_SOLUTION="learner", COLUMNS="200")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--task",
            "3",
            "tests/test_week_1_day_1.py",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 1, result.stdout[-2000:]
    summary = result.stdout.strip().splitlines()[-1]
    assert " failed" in summary and " deselected" in summary and "passed" not in summary
    assert "NotImplementedError: Week 1 Day 1" in result.stdout
