"""What every command-line program shares: options checked into one-line errors.

The engine's options are in engine_options.py, what a package has built in
probes.py, model loading in model_loading.py, the engine's log line in
engine_log.py. None of them imports MLX at module level: main.py and batch-main.py
import them before the project, which must load the fast BLAS before mlx.core.
"""

import argparse
import math
import os
import re
import stat
import sys
from collections.abc import Iterable
from typing import NoReturn


def fail(message: str, status: int = 2) -> NoReturn:
    """Print one line to stderr and exit: bad input (2) or a failure to load (1)."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(status)


def option_parser(description: str) -> argparse.ArgumentParser:
    """An ArgumentParser whose every complaint is one `error:` line and status 2."""
    parser = argparse.ArgumentParser(description=description)
    parser.error = fail
    return parser


def dest(option: str) -> str:
    """The argparse attribute of an option as typed: `--max-tokens` -> max_tokens."""
    return option.removeprefix("--").replace("-", "_")


def option_values(args: argparse.Namespace, option: str) -> list:
    """The values given for `option` as typed (`--max-tokens`); a list option's items."""
    value = getattr(args, dest(option))
    return value if isinstance(value, list) else [value]


def require_at_least(args: argparse.Namespace, minimum: int, *options: str) -> None:
    """Each of `options` (as typed, `--max-tokens`) is at least `minimum` or unset."""
    for option in options:
        for value in option_values(args, option):
            if value is not None and value < minimum:
                fail(f"{option} must be at least {minimum}, got {value}")


def require_finite(option: str, value: float) -> None:
    """NaN and infinity pass every `<` and `>` check a range makes: refuse them first."""
    if not math.isfinite(value):
        fail(f"{option} must be a finite number, got {value}")


def require_positive(args: argparse.Namespace, *options: str) -> None:
    """Each of `options` is a finite number above 0 (seconds, rates) or unset."""
    for option in options:
        for value in option_values(args, option):
            if value is not None:
                require_finite(option, value)
                if value <= 0:
                    fail(f"{option} must be more than 0, got {value}")


def require_fraction(args: argparse.Namespace, *options: str) -> None:
    """Each of `options` is a fraction from 0 to 1."""
    for option in options:
        for value in option_values(args, option):
            if not 0 <= value <= 1:
                fail(f"{option} must be between 0 and 1, got {value}")


def fail_with_options(error: Exception, options: Iterable[str]) -> NoReturn:
    """fail() with a library's error, its parameter names (`max_seq_len`) put back
    as the options the user typed (`--max-seq-len`)."""
    message = str(error)
    for option in options:
        message = re.sub(rf"(?<![\w-]){dest(option)}\b", option, message)
    fail(message)


def require_model_name(name: str | None) -> None:
    if name is not None and not name.strip():
        fail(
            "--model is empty: give a model folder or a Hub repo id, or leave --model "
            "out for the embedded model"
        )


def read_piped_stdin() -> str | None:
    """The text on standard input when it is a pipe or a redirected file, else None.

    A terminal, /dev/null or a closed stdin is not read: `pdm run main` alone must
    not wait for input nobody is going to type.
    """
    try:
        mode = os.fstat(sys.stdin.fileno()).st_mode
    except (OSError, ValueError, AttributeError):
        return None
    if not (stat.S_ISFIFO(mode) or stat.S_ISREG(mode)):
        return None
    return read_stdin()


def read_stdin() -> str:
    try:
        return sys.stdin.buffer.read().decode("utf-8")
    except UnicodeDecodeError:
        fail("standard input is not UTF-8 text")
