"""The code base's shape, as its style rules state it: every module outside the
tests readable in one sitting (at most 400 lines), and no two project modules that
import each other, type-only imports included (scripts/tools/import_cycles.py
reads the imports with ast)."""

from pathlib import Path

from scripts.tools.import_cycles import circle, cycles, imports_of, module_files

ROOT = Path(__file__).resolve().parents[1]
MOST_LINES = 400


def test_no_module_outside_the_tests_passes_400_lines():
    files = [
        *ROOT.glob("*.py"),
        *ROOT.glob("scripts/**/*.py"),
        *ROOT.glob("src/**/*.py"),
    ]
    long = {
        str(path.relative_to(ROOT)): lines
        for path in files
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MOST_LINES
    }
    assert not long, f"split these (lines): {long}"


def test_no_import_cycle_among_the_project_modules():
    files = module_files()
    graph = {name: imports_of(name, path, set(files)) for name, path in files.items()}
    found = [" -> ".join(circle(graph, group)) for group in cycles(graph)]
    assert len(files) > 100  # the walk found the project
    assert not found, found
