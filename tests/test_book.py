"""Checks that the book in book/ hangs together: pure file checks, no tiny_llm imports.

- every chapter linked from SUMMARY.md exists;
- every `{{#include path}}` (mdbook's include, `:anchor` or `:lines` stripped) resolves,
  relative to the chapter that contains it;
- every relative link between chapters (outside code blocks) resolves;
- every `pdm run test --week W --day D` a chapter tells the reader to run has its
  tests/test_week_W_day_D.py;
- the preface and the setup chapter exist.

A failure lists each problem as `book/src/CHAPTER.md:LINE: what is wrong`.
"""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BOOK = ROOT / "book"
SRC = BOOK / "src"
TESTS = ROOT / "tests"

LINK = re.compile(r"\[[^\]]*\]\(([^)]*)\)")
INCLUDE = re.compile(r"(?<!\\)\{\{\s*#(?:rustdoc_)?include\s+([^}\s]+)\s*\}\}")
TEST_COMMAND = re.compile(r"pdm run test(?:-refsol)?((?:\s+--(?:week|day)\s+\d+)+)")
OPTION = re.compile(r"--(week|day)\s+(\d+)")


def chapters() -> list[Path]:
    return sorted(SRC.rglob("*.md"))


def where(path: Path, line_number: int) -> str:
    return f"{path.relative_to(ROOT)}:{line_number}"


def numbered_lines(path: Path):
    yield from enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)


def report(problems: list[str]) -> str:
    return "\n" + "\n".join(problems)


def test_book_toml_points_at_src():
    book_toml = (BOOK / "book.toml").read_text(encoding="utf-8")
    assert re.search(r'^src\s*=\s*"src"\s*$', book_toml, re.MULTILINE), (
        'book/book.toml must say src = "src"'
    )


def test_summary_links_exist():
    summary = SRC / "SUMMARY.md"
    assert summary.is_file(), "book/src/SUMMARY.md is missing"
    problems = []
    linked = 0
    for number, line in numbered_lines(summary):
        for target in LINK.findall(line):
            target = target.split("#", 1)[0].strip()
            if target.startswith(("http://", "https://")):
                continue
            linked += 1
            if not target:
                problems.append(f"{where(summary, number)}: chapter has no file")
            elif not (SRC / target).is_file():
                problems.append(f"{where(summary, number)}: {target} does not exist")
    assert linked > 0, "book/src/SUMMARY.md links no chapters"
    assert not problems, report(problems)


def test_includes_resolve():
    problems = []
    for chapter in chapters():
        for number, line in numbered_lines(chapter):
            for argument in INCLUDE.findall(line):
                target = argument.split(":", 1)[0]
                if not (chapter.parent / target).is_file():
                    problems.append(
                        f"{where(chapter, number)}: {{{{#include {argument}}}}} "
                        f"does not resolve: {target} does not exist "
                        "(paths are relative to the chapter)"
                    )
    assert not problems, report(problems)


def prose_lines(path: Path):
    """Numbered lines outside fenced code blocks, where `[text](target)` is a link."""
    in_code = False
    for number, line in numbered_lines(path):
        if line.lstrip().startswith(("```", "~~~")):
            in_code = not in_code
        elif not in_code:
            yield number, line


def test_links_between_chapters_resolve():
    problems = []
    for chapter in chapters():
        if chapter.name == "SUMMARY.md":
            continue  # test_summary_links_exist reports these
        for number, line in prose_lines(chapter):
            for target in LINK.findall(line):
                path = target.split("#", 1)[0].strip()
                if not path or ":" in path or " " in path:
                    continue  # an anchor in the same page, a URL, or not a link
                if not (chapter.parent / path).exists():
                    problems.append(
                        f"{where(chapter, number)}: link to {path} is broken"
                    )
    assert not problems, report(problems)


def test_test_commands_have_test_files():
    problems = []
    for chapter in chapters():
        for number, line in numbered_lines(chapter):
            for options in TEST_COMMAND.findall(line):
                values = dict(OPTION.findall(options))
                week, day = values.get("week"), values.get("day")
                if week is None:
                    problems.append(f"{where(chapter, number)}: --day without --week")
                elif day is None:
                    if not list(TESTS.glob(f"test_week_{week}_day_*.py")):
                        problems.append(
                            f"{where(chapter, number)}: no tests/test_week_{week}_day_*.py"
                        )
                elif not (TESTS / f"test_week_{week}_day_{day}.py").is_file():
                    problems.append(
                        f"{where(chapter, number)}: "
                        f"tests/test_week_{week}_day_{day}.py does not exist"
                    )
    assert not problems, report(problems)


def test_preface_and_setup_exist():
    missing = [
        name for name in ("preface.md", "setup.md") if not (SRC / name).is_file()
    ]
    assert not missing, f"book/src is missing {', '.join(missing)}"
