"""The code base's shape, as its style rules state it: every module outside the
tests readable in one sitting (at most 400 lines), no two project modules that
import each other, type-only imports included (scripts/tools/import_cycles.py
reads the imports with ast), and a Request (of the package under test) that holds
at most 20 attributes."""

import dataclasses
import subprocess
import sys
from pathlib import Path

from scripts.tools.import_cycles import circle, cycles, imports_of, module_files

from .module_attributes import ALONE
from .solution import tiny

ROOT = Path(__file__).resolve().parents[1]
MOST_LINES = 400
MOST_REQUEST_FIELDS = 20


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


def test_every_module_imports():
    """In a child process (the benchmarks take Ctrl-C at import): a name moved to
    another module and still imported from the old one fails here, not at a
    user's first run. Modules for clients that are not installed (the optional
    client checks) may miss those packages only. Then, in the same process,
    tests/module_attributes.py: every module.name read from a project module
    exists there."""
    code = (
        "import importlib, sys\n"
        "from scripts.tools.import_cycles import module_files\n"
        "project = {name.split('.')[0] for name in module_files()}\n"
        f"ALONE = {ALONE!r}\n"
        "for name in sorted(module_files()):\n"
        "    if name.replace('-', '_') != name or name in ALONE:\n"
        "        continue\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except ModuleNotFoundError as error:\n"
        "        if (error.name or '').split('.')[0] in project:\n"
        "            print(name, repr(error))\n"
        "    except Exception as error:\n"
        "        print(name, repr(error))\n"
        "from tests.module_attributes import missing_names\n"
        "print(*missing_names(), sep='\\n', end='')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout == "", result.stdout


def test_a_request_holds_at_most_20_attributes():
    """Request's dataclass fields (its InitVars are not kept, so they do not count)."""
    names = [field.name for field in dataclasses.fields(tiny.Request)]
    assert len(names) <= MOST_REQUEST_FIELDS, (
        f"Request has {len(names)} fields, more than {MOST_REQUEST_FIELDS}: {names}. "
        "Make a setting it only starts from an InitVar and keep what it becomes (as "
        "constraint -> constraint_state, clock -> metrics.clock), or give state that "
        "belongs together an object of its own (as DraftState, PromptChoice)"
    )
