"""A request's structured-output option as the engine's own constraint, checked.

The engine recognises constraints by its package's classes (tiny_llm_ref.Regex is
not tiny_llm.Regex), so the server builds them with that package's: the caller
passes a ConstraintFactory to create_app, as it passes the package's make_sampler.
JSON constraints (JsonSchema, JsonObject) are the shared tiny_llm_base's. Tool
calls (week 4 day 2) are the package's too: its tool_constraint makes the grammar
and its parse_tool_calls reads the calls back out of the answer.
"""

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from tiny_llm_base import Grammar, JsonObject, JsonSchema, UnsatisfiableConstraint
from tiny_llm_base.structured import JSON_OPTIONS

from .errors import ApiError, invalid
from .request import ConstraintRequest
from .tool_answers import CallCheck


@dataclass(frozen=True)
class ConstraintFactory:
    """A package's constraint kinds. regex(pattern) and choice(options) build its
    Regex and Choice; start(constraint, tokenizer, vocab_size) is its
    start_constraint, raising ValueError or TypeError for a constraint that cannot
    be met, NotImplementedError while week 3 day 5 is not written.
    tools(tools, tool_choice, parallel_tool_calls) builds the tool-call constraint
    and parse_tool_calls(text) -> (content, calls) reads an answer (week 4 day 2)."""

    regex: Callable[[str], Any]
    choice: Callable[[list[str]], Any]
    start: Callable[[Any, Any, int], Any]
    tools: Callable[[list, Any, bool], Any]
    parse_tool_calls: Callable[[str], tuple[str, list]]

    @classmethod
    def of(cls, package: ModuleType) -> "ConstraintFactory":
        """The factory of a course package (tiny_llm_ref, tiny_llm)."""
        return cls(
            package.Regex,
            package.Choice,
            package.start_constraint,
            package.tool_constraint,
            package.parse_tool_calls,
        )


def checked_constraint(
    engine, factory: ConstraintFactory, constraint: ConstraintRequest | None
):
    """The engine's constraint for a request's structured-output option, started
    once against the tokenizer so that a bad one is a 400 here, not a failed
    answer: a schema with an unsupported keyword or nothing it can match, a regex
    that does not parse or matches nothing, a choice no token can spell. A package
    without structured outputs yet gets a 501."""
    if constraint is None:
        return None
    try:
        if constraint.kind == "json_schema":
            made = JsonSchema(constraint.value)
        elif constraint.kind == "json_object":
            made = JsonObject()
        elif constraint.kind == "regex":
            made = factory.regex(constraint.value)
        elif constraint.kind == "tools":
            made = tools_constraint(factory, constraint)
            CallCheck(constraint)  # a schema jsonschema cannot check: a 400
        else:
            made = factory.choice(constraint.value)
        factory.start(made, engine.tokenizer, engine.model.vocab_size)
    except (TypeError, ValueError) as error:
        raise invalid(constraint.worded(str(error)), constraint.param) from None
    except NotImplementedError as error:
        what = "tool calls" if constraint.kind == "tools" else "structured outputs"
        raise ApiError(
            501,
            f"{what} are not written yet ({error}): leave {constraint.param} out",
            param=constraint.param,
            code="not_implemented",
        ) from None
    return made


def tools_constraint(factory: ConstraintFactory, constraint: ConstraintRequest):
    """The tools' grammar; with an answer_format, the union of the answers the two
    allow under tool_choice "auto" (calls, as under "required", or JSON in the
    format), the format alone under "none", calls alone otherwise."""
    tools, choice, parallel = constraint.value
    form = constraint.answer_format
    if form is None or choice not in ("auto", "none"):
        return factory.tools(tools, choice, parallel)
    try:
        answer = JsonSchema(form.value) if form.kind == "json_schema" else JsonObject()
        answer.check()
    except ValueError as error:
        raise invalid(form.worded(str(error)), form.param) from None
    if choice == "none":
        return answer
    calls = factory.tools(tools, "required", parallel)
    return calls_or_answer(calls.lark, answer.schema)


def calls_or_answer(calls: str, schema: str) -> Grammar:
    """A Lark grammar whose answer is either what `calls` (a grammar of calls only,
    its first rule `start`) accepts, or JSON (compact) that `schema` accepts."""
    rules = re.sub(r"^start:", "tool_calls_answer:", calls, count=1, flags=re.M)
    answer = {**json.loads(schema), "x-guidance": JSON_OPTIONS}
    return Grammar(
        "start: tool_calls_answer | format_answer\n"
        f"format_answer: %json {json.dumps(answer)}\n{rules}"
    )


def generation_error(result, constraint_param: str | None) -> ApiError:
    """A request the engine failed: the client's constraint when it could not go on
    (a 400 naming its field), else the server's fault (500)."""
    marker = f"{UnsatisfiableConstraint.__name__}: "
    if constraint_param and marker in result.error:
        reason = result.error.partition(marker)[2]
        return invalid(
            f"{constraint_param} cannot be met: after {len(result.tokens)} tokens of "
            f"answer, {reason}",
            constraint_param,
        )
    return ApiError(500, f"generation failed: {result.error}", "server_error")
