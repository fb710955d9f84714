"""The structured-output options of the command-line tools (week 3 day 5):

    --json-schema FILE   the answer is JSON valid against the schema in FILE
    --json-object        the answer is a JSON object
    --regex PATTERN      the answer matches PATTERN (the course's subset)
    --choice TEXT        the answer is one of the TEXTs (repeat the option)

At most one; it applies to every prompt of the run.
"""

import argparse
import json
from collections import deque
from pathlib import Path

from tiny_llm_base import JsonObject, JsonSchema, PromptSpec

from .cli import fail


def json_schema_file(path: str) -> JsonSchema:
    """--json-schema's value: the file's schema, checked (llguidance compiles it),
    so a bad one is refused before the model loads."""
    try:
        schema = JsonSchema(json.loads(Path(path).read_text()))
        schema.check()
    except OSError as error:
        raise argparse.ArgumentTypeError(
            f"cannot read {path} ({error.strerror})"
        ) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise argparse.ArgumentTypeError(f"{path} is not JSON ({error})") from None
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"{path}: {error}") from None
    return schema


def add_constraint_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "structured outputs (week 3 day 5; at most one, for every prompt)"
    ).add_mutually_exclusive_group()
    group.add_argument(
        "--json-schema",
        metavar="FILE",
        type=json_schema_file,
        help="answers are JSON valid against the JSON Schema in FILE",
    )
    group.add_argument(
        "--json-object", action="store_true", help="answers are JSON objects"
    )
    group.add_argument(
        "--regex", metavar="PATTERN", help="answers match PATTERN as a whole"
    )
    group.add_argument(
        "--choice",
        metavar="TEXT",
        action="append",
        help="answers are exactly one of the TEXTs (repeat: --choice yes --choice no)",
    )


def constraint_option(args: argparse.Namespace, package):
    """The package's constraint for the option given (argparse allowed at most one
    and read the schema file), or None."""
    if args.json_schema is not None:
        return args.json_schema
    if args.json_object:
        return JsonObject()
    if args.regex is not None:
        return package.Regex(args.regex)
    if args.choice:
        return package.Choice(args.choice)
    return None


def check_constraint(constraint, package, tokenizer, vocab_size: int) -> None:
    """Exit with the constraint's own message when it cannot start (a regex that
    does not parse or matches nothing, an unsupported schema keyword...), or when
    the model's tokens cannot spell one of --choice's options (check_choice)."""
    if constraint is None:
        return
    if isinstance(constraint, package.Choice):
        for option in constraint.options:
            check_choice(option, package, tokenizer, vocab_size)
    try:
        package.start_constraint(constraint, tokenizer, vocab_size)
    except (TypeError, ValueError) as error:
        fail(f"bad constraint: {error}")


def check_choice(option: str, package, tokenizer, vocab_size: int) -> None:
    """Exit naming `option` when a request could fail to write it: a character no
    token holds (start_constraint's ValueError), or tokens that lead part of the way
    and then let no token follow (stuck_text), where a run's request would fail
    ("no token of the vocabulary can continue the constraint here")."""
    try:
        state = package.start_constraint(
            package.Choice([option]), tokenizer, vocab_size
        )
    except ValueError as error:
        fail(f"--choice {option!r}: {error}")
    stuck = stuck_text(state)
    if stuck is not None:
        fail(
            f"--choice {option!r}: a request could get stuck writing it: after "
            f"{stuck!r} no token continues it (its next characters come only inside "
            "longer tokens); change or leave out that choice"
        )


def stuck_text(state) -> str | None:
    """The shortest text of tokens that a ConstraintState allows one after another
    (every allowed token, from every state reached, as sampling may pick them) and
    after which no token is allowed; None when there is none. Every reachable
    state is built, so this is for small automata: one --choice option's."""
    index = state.index
    texts = index.vocabulary.texts
    start = (state.state, state.at_start)
    reached, queue = {start: ""}, deque([start])
    while queue:
        place = queue.popleft()
        allowed = index.allowed(*place)
        if allowed.count == 0:
            return reached[place]
        for token, after in sorted(allowed.next_state.items()):
            if (after, False) not in reached:
                reached[(after, False)] = reached[place] + texts[token]
                queue.append((after, False))
    return None


def constrained_prompts(prompts: list, constraint) -> list:
    """The prompts as PromptSpecs carrying the constraint (unchanged without one)."""
    if constraint is None:
        return prompts
    return [PromptSpec(prompt, constraint=constraint) for prompt in prompts]
