"""Checks that the book in book/ builds and hangs together; no tiny_llm imports.

- mdbook builds it (scripts/commands/book.py --build, into a temporary folder) without
  printing one warning or error, and every chapter comes out as a page;
- SUMMARY.md links every chapter file, and every chapter it links exists;
- every `{{#include path:anchor}}` resolves, relative to the chapter that contains
  it, and the anchor is marked (`ANCHOR: name` ... `ANCHOR_END: name`) in that file;
  no include reads src/tiny_llm_ref: the book builds without it, and shows a day's
  code only as the skeleton has it (signature, docstring, the day's stub);
- every relative link between chapters (outside code blocks) resolves, and so does
  its `#anchor`, against the heading ids mdbook gives the target page;
- every day chapter (weekW-0D-*.md) tells the reader to run `pdm run test --week W
  --day D`, and every test command a chapter mentions has its test files.

A failure lists each problem as `book/src/CHAPTER.md:LINE: what is wrong`.
"""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BOOK = ROOT / "book"
SRC = BOOK / "src"
TESTS = ROOT / "tests"
SUMMARY = SRC / "SUMMARY.md"

LINK = re.compile(r"\[[^\]]*\]\(([^)]*)\)")
INCLUDE = re.compile(r"(?<!\\)\{\{\s*#(?:rustdoc_)?include\s+([^}\s]+)\s*\}\}")
TEST_COMMAND = re.compile(r"pdm run test(?:-refsol)?((?:\s+--(?:week|day)\s+\d+)+)")
OPTION = re.compile(r"--(week|day)\s+(\d+)")
DAY_CHAPTER = re.compile(r"week(\d+)-0*(\d+)-.*\.md")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")
CUSTOM_ID = re.compile(r"\s*\{#([\w-]+)\}\s*$")
HTML_ID = re.compile(r'\bid="([^"]+)"')


def chapters() -> list[Path]:
    return sorted(SRC.rglob("*.md"))


def where(path: Path, line_number: int) -> str:
    return f"{path.relative_to(ROOT)}:{line_number}"


def numbered_lines(path: Path):
    yield from enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)


def prose_lines(path: Path):
    """Numbered lines outside fenced code blocks, where `[text](target)` is a link."""
    in_code = False
    for number, line in numbered_lines(path):
        if line.lstrip().startswith(("```", "~~~")):
            in_code = not in_code
        elif not in_code:
            yield number, line


def report(problems: list[str]) -> str:
    return "\n" + "\n".join(problems)


def summary_targets() -> list[tuple[int, str]]:
    """(line, target) of every chapter link in SUMMARY.md, anchors stripped."""
    return [
        (number, target.split("#", 1)[0].strip())
        for number, line in numbered_lines(SUMMARY)
        for target in LINK.findall(line)
        if not target.startswith(("http://", "https://"))
    ]


def heading_id(text: str) -> str:
    """mdbook's id for a heading: its text lowercased, whitespace to '-', and every
    character that is not a letter, digit, '_' or '-' dropped."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link counts as its text
    text = text.replace("`", "").replace("*", "")
    return "".join(
        "-" if ch.isspace() else ch.lower()
        for ch in text
        if ch.isalnum() or ch in "_-" or ch.isspace()
    )


def heading_ids(path: Path) -> list[str]:
    """The ids mdbook gives the headings of a page, repeats numbered -1, -2, ..."""
    ids: list[str] = []
    for _, line in prose_lines(path):
        match = HEADING.match(line)
        if not match:
            continue
        text = match.group(1)
        custom = CUSTOM_ID.search(text)
        if custom:
            ids.append(custom.group(1))
            continue
        base = heading_id(text)
        candidate, repeat = base, 0
        while candidate in ids:
            repeat += 1
            candidate = f"{base}-{repeat}"
        ids.append(candidate)
    return ids


def test_book_toml_points_at_src():
    book_toml = (BOOK / "book.toml").read_text(encoding="utf-8")
    assert re.search(r'^src\s*=\s*"src"\s*$', book_toml, re.MULTILINE), (
        'book/book.toml must say src = "src"'
    )


def test_preface_and_setup_exist():
    missing = [
        name for name in ("preface.md", "setup.md") if not (SRC / name).is_file()
    ]
    assert not missing, f"book/src is missing {', '.join(missing)}"


def test_summary_links_exist():
    assert SUMMARY.is_file(), "book/src/SUMMARY.md is missing"
    targets = summary_targets()
    assert targets, "book/src/SUMMARY.md links no chapters"
    problems = []
    for number, target in targets:
        if not target:
            problems.append(f"{where(SUMMARY, number)}: chapter has no file")
        elif not (SRC / target).is_file():
            problems.append(f"{where(SUMMARY, number)}: {target} does not exist")
    assert not problems, report(problems)


def test_every_chapter_is_in_summary():
    linked = {(SRC / target).resolve() for _, target in summary_targets() if target}
    missing = [
        f"{chapter.relative_to(ROOT)}: not linked from book/src/SUMMARY.md, so mdbook "
        "leaves it out of the book: add it there"
        for chapter in chapters()
        if chapter != SUMMARY and chapter.resolve() not in linked
    ]
    assert not missing, report(missing)


def anchor_of(argument: str) -> str | None:
    """The anchor of an include argument `path:anchor`; None for a whole file or a
    line range (`path:10:20`, `path:10:`, `path::20`)."""
    parts = argument.split(":")[1:]
    if not parts or all(part == "" or part.isdigit() for part in parts):
        return None
    return parts[0]


def test_includes_resolve():
    problems = []
    for chapter in chapters():
        for number, line in numbered_lines(chapter):
            for argument in INCLUDE.findall(line):
                target = chapter.parent / argument.split(":", 1)[0]
                if not target.is_file():
                    problems.append(
                        f"{where(chapter, number)}: {{{{#include {argument}}}}} "
                        f"does not resolve: {argument.split(':', 1)[0]} "
                        "does not exist (paths are relative to the chapter)"
                    )
                    continue
                anchor = anchor_of(argument)
                if anchor is None:
                    continue
                text = target.read_text(encoding="utf-8")
                for marker in ("ANCHOR", "ANCHOR_END"):
                    if not re.search(rf"\b{marker}:\s*{re.escape(anchor)}\b", text):
                        problems.append(
                            f"{where(chapter, number)}: {{{{#include {argument}}}}}: "
                            f"no `{marker}: {anchor}` in {target.resolve().relative_to(ROOT)}"
                            " (mdbook would include nothing, silently)"
                        )
    assert not problems, report(problems)


def test_the_book_includes_no_reference_code():
    problems = [
        f"{where(path, number)}: includes {target}: include src/tiny_llm (the "
        "skeleton) or tiny_llm_base instead"
        for path in chapters()
        for number, line in numbered_lines(path)
        for target in INCLUDE.findall(line)
        if "tiny_llm_ref" in target
    ]
    assert not problems, report(problems)


def test_links_between_chapters_resolve():
    problems = []
    for chapter in chapters():
        if chapter == SUMMARY:
            continue  # test_summary_links_exist reports these
        for number, line in prose_lines(chapter):
            for target in LINK.findall(line):
                path, _, anchor = target.strip().partition("#")
                if ":" in path or " " in path:
                    continue  # a URL, or not a link
                page = chapter.parent / path if path else chapter
                if not page.exists():
                    problems.append(
                        f"{where(chapter, number)}: link to {path} is broken"
                    )
                elif (
                    anchor and page.suffix == ".md" and anchor not in heading_ids(page)
                ):
                    problems.append(
                        f"{where(chapter, number)}: link to {target}: {page.name} has no "
                        f"heading with id {anchor!r} (ids: lowercase heading text, "
                        "spaces as '-', punctuation dropped)"
                    )
    assert not problems, report(problems)


def test_day_chapters_name_their_test_command():
    problems = []
    for chapter in chapters():
        match = DAY_CHAPTER.fullmatch(chapter.name)
        if not match:
            continue
        week, day = match.groups()
        command = re.compile(rf"pdm run test\s+--week\s+{week}\s+--day\s+{day}\b")
        if not command.search(chapter.read_text(encoding="utf-8")):
            problems.append(
                f"{chapter.relative_to(ROOT)}: never tells the reader to run "
                f"`pdm run test --week {week} --day {day}`"
            )
    assert not problems, report(problems)


def day_test_files(week: str, day: str) -> list[Path]:
    """What `pdm run test --week W --day D` runs: test_week_W_day_D[_*].py."""
    return [
        *TESTS.glob(f"test_week_{week}_day_{day}.py"),
        *TESTS.glob(f"test_week_{week}_day_{day}_*.py"),
    ]


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
                elif not day_test_files(week, day):
                    problems.append(
                        f"{where(chapter, number)}: "
                        f"tests/test_week_{week}_day_{day}.py does not exist"
                    )
    assert not problems, report(problems)


def test_book_builds_without_warnings(tmp_path):
    dest = tmp_path / "html"
    result = subprocess.run(
        [sys.executable, "-m", "scripts.commands.book", "--build", "--dest", str(dest)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"building the book failed:\n{output}"
    complaints = [
        line
        for line in result.stdout.splitlines() + result.stderr.splitlines()
        if re.match(r"\s*(WARN|ERROR)\b", line)
    ]
    assert not complaints, "mdbook warned:\n" + "\n".join(complaints)

    problems = []
    for chapter in chapters():
        if chapter == SUMMARY:
            continue
        page = dest / chapter.relative_to(SRC).with_suffix(".html")
        if not page.is_file():
            problems.append(f"{chapter.relative_to(ROOT)}: no {page.name} was built")
            continue
        html = page.read_text(encoding="utf-8")
        if "{{#" in html:
            problems.append(
                f"{chapter.relative_to(ROOT)}: an mdbook directive was left unexpanded"
            )
        built_ids = set(HTML_ID.findall(html))
        for anchor in heading_ids(chapter):
            if anchor not in built_ids:
                problems.append(
                    f"{chapter.relative_to(ROOT)}: this test computes heading id "
                    f"{anchor!r}, which mdbook did not produce"
                )
    assert not problems, report(problems)


MAX_CHAPTER_WORDS = 4000
MAX_MAIN_PATH_WORDS = 60000


def main_path() -> list[Path]:
    """The chapters of SUMMARY.md from the preface to week 4's last day: everything
    before the appendix part and the chapters after the separator."""
    text = SUMMARY.read_text(encoding="utf-8").split("\n# Appendix", 1)[0]
    text = text.split("\n---", 1)[0]
    return [SRC / target for target in re.findall(r"\]\(\./([^)#]+)\)", text)]


def test_main_path_chapters_are_lessons_of_at_most_4000_words():
    """Counted as `wc -w` counts the Markdown: runs of non-whitespace."""
    problems = []
    for chapter in main_path():
        words = len(chapter.read_text(encoding="utf-8").split())
        if words > MAX_CHAPTER_WORDS:
            problems.append(
                f"{chapter.relative_to(ROOT)}: {words} words, over "
                f"{MAX_CHAPTER_WORDS}: move reference material to an appendix page"
            )
    assert main_path(), "SUMMARY.md lists no chapters"
    assert not problems, report(problems)


def test_the_main_path_is_at_most_60000_words():
    """The course a learner reads from the preface to week 4's last day, counted as
    the chapters are."""
    counts = {c: len(c.read_text(encoding="utf-8").split()) for c in main_path()}
    total = sum(counts.values())
    longest = sorted(counts.items(), key=lambda item: -item[1])[:5]
    assert total <= MAX_MAIN_PATH_WORDS, (
        f"the main path is {total:,} words, over {MAX_MAIN_PATH_WORDS:,}: move "
        "reference material to an appendix page; the longest chapters: "
        + ", ".join(f"{c.relative_to(ROOT)} {n:,}" for c, n in longest)
    )
