"""The course package a benchmark measures: `--solution learner` (src/tiny_llm, your
code) or `ref` (src/tiny_llm_ref; the default when it is there). A benchmark adds
the option (add_option), calls use(args) once its options are read, and reaches the
package's names through `course` (course.Engine, course.Qwen2ModelWeek2), so that
nothing imports the reference before the choice. run_benchmark(main) ends a
benchmark whose package lacks a day it needs with one line naming the day, and one
stopped by Ctrl-C with one line, status 130.

Imports nothing from MLX at module level.
"""

import argparse
import sys
from collections.abc import Callable
from types import ModuleType

from scripts.commands import interrupt
from scripts.commands.solution import (
    add_solution_option,
    check_solution,
    not_written_yet,
    solution_package,
)


class Course:
    """Attribute access on the chosen package."""

    package: ModuleType | None = None
    solution: str | None = None  # "learner" or "ref"

    def __getattr__(self, name: str):
        if self.package is None:
            raise RuntimeError("no package chosen yet: call course.use(args) first")
        return getattr(self.package, name)


course = Course()


def add_option(parser: argparse.ArgumentParser) -> None:
    add_solution_option(parser)


def use(args: argparse.Namespace) -> ModuleType:
    """The package --solution names (checked: one error line when it is absent)."""
    check_solution(args)
    course.package = solution_package(args.solution)
    course.solution = args.solution
    return course.package


def run_benchmark(main: Callable[[], int | None]) -> None:
    """sys.exit(main()), a day the package has not written ending in one line.
    The script's imports are done: from here Ctrl-C unwinds (interrupt.py), and its
    one line says what was kept (Bench.keep: the finished parts) or that nothing
    was."""
    interrupt.unwind_on_interrupt()
    interrupt.say_when_interrupted("no record written")
    try:
        sys.exit(main())
    except NotImplementedError as error:
        not_written_yet(error)
