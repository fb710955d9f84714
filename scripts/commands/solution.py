"""Which package a command runs: `--solution learner` (src/tiny_llm, your code) or
`--solution ref` (src/tiny_llm_ref, the reference).

A learner who does not peek has no src/tiny_llm_ref: every command and benchmark
runs on src/tiny_llm alone. The default is the reference when it is there (so a
fresh clone's `pdm run main` answers at once) and the learner's package when it is
not. A day the package has not written yet ends the command with one line naming
the day (the stub's NotImplementedError), never a traceback.

Imports nothing from MLX at module level (scripts.commands.cli's rule).
"""

import argparse
import importlib
import importlib.util
from types import ModuleType

from scripts.commands.cli import fail

PACKAGES = {"learner": "tiny_llm", "ref": "tiny_llm_ref"}


def has_reference() -> bool:
    return importlib.util.find_spec(PACKAGES["ref"]) is not None


def default_solution() -> str:
    return "ref" if has_reference() else "learner"


def add_solution_option(parser: argparse.ArgumentParser, extra: tuple = ()) -> None:
    """--solution ref | learner (and `extra` choices, such as mlx)."""
    choices = ("ref", "learner", *extra)
    parser.add_argument(
        "--solution",
        default=None,
        metavar="|".join(choices),
        help="learner: your src/tiny_llm; ref: the reference src/tiny_llm_ref "
        "(default: ref when it is there, else learner)"
        + ("; mlx: mlx-lm's own model" if "mlx" in extra else ""),
    )


def check_solution(args: argparse.Namespace, extra: tuple = ()) -> None:
    """Fill in the default; one error line for an unknown name or an absent
    reference."""
    choices = ("ref", "learner", *extra)
    if args.solution is None:
        args.solution = default_solution()
    if args.solution not in choices:
        named = ", ".join(choices[:-1]) + f" or {choices[-1]}"
        fail(f"unknown --solution {args.solution!r}: choose {named}")
    if args.solution == "ref" and not has_reference():
        fail(
            "--solution ref needs src/tiny_llm_ref, which this tree does not have: "
            "use --solution learner to run your own code"
        )


def solution_package(name: str) -> ModuleType:
    """The package of --solution `name` (learner or ref), imported."""
    return importlib.import_module(PACKAGES[name])


def not_written_yet(error: NotImplementedError) -> None:
    """The one line a command ends with when a day it needs is still a stub (the
    stub's message names the day)."""
    fail(f"not implemented yet in src/tiny_llm: {error}", status=1)
