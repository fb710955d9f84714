"""The learner skeleton and the reference expose the same public API, and the
skeleton's course functions fail loudly with NotImplementedError naming the day.

The API checks run against either package. The checks of the untouched skeleton
(every function raises NotImplementedError naming its day) run only in the reference
run, `pdm run test-refsol`: in a learner's run the skeleton is their work in
progress, and a function they have written is no failure.
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


@skeleton_check
@pytest.mark.parametrize("path", skeleton_modules(), ids=lambda p: p.name)
def test_skeleton_functions_raise_not_implemented_with_the_day(path):
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.FunctionDef) or node.name == "__init__":
            continue
        raises = [n for n in ast.walk(node) if isinstance(n, ast.Raise)]
        messages = [ast.unparse(r.exc) for r in raises if r.exc is not None]
        assert any(
            re.search(r"NotImplementedError\(['\"]Week \d Day \d", m) for m in messages
        ), (
            f"{path.name}:{node.lineno} {node.name} must raise "
            "NotImplementedError('Week W Day D: ...') in the untouched skeleton "
            f"(this {UNTOUCHED_SKELETON})"
        )


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
